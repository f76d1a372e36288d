// Benchmark cases of the NF4/FP4 and GGUF families (filled in as the families land).
#include "bench_common.h"

namespace bench {

void add_family_cases(Runner &, int64_t) {}

}  // namespace bench
