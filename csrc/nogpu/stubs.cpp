// A build without CUDA: every GPU entry of the list (csrc/core/entries.h) exists and
// reports that the library was built without CUDA; the _host entries do the work.
#include "../core/entries.h"
#include "../core/status.h"

#define KBIT_DEFINE_STUB(name, PARAMS, TAIL, FN)                                                 \
    extern "C" KBIT_API kbit_status name(PARAMS(KBIT_TYPE0_, KBIT_TYPE_) TAIL(KBIT_TYPE_)) {     \
        return kbit::guarded([] {                                                                \
            return kbit::fail(KBIT_ERROR_NOT_SUPPORTED, #name ": libkbit was built without CUDA"); \
        });                                                                                      \
    }

KBIT_KBIT_ENTRIES(KBIT_DEFINE_STUB, KBIT_SKIP_ENTRY)
KBIT_CODEBOOK_ENTRIES(KBIT_DEFINE_STUB, KBIT_SKIP_ENTRY)
KBIT_BNB4_ENTRIES(KBIT_DEFINE_STUB, KBIT_SKIP_ENTRY)
KBIT_GGUF_ENTRIES(KBIT_DEFINE_STUB, KBIT_SKIP_ENTRY)
KBIT_MATMUL_ENTRIES(KBIT_DEFINE_STUB, KBIT_SKIP_ENTRY)

extern "C" KBIT_API int kbit_cuda_available(void) { return 0; }
