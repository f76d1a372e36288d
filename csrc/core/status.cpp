// Errors, status names and library information: the parts of the ABI that need no GPU.
#include "status.h"

#include <cstdarg>
#include <cstdio>

namespace kbit {

namespace {
// A fixed buffer, not a string: the message must be stored even when the failure is
// that memory ran out (a std::string could not take it then, and the message was lost).
thread_local char g_last_error[512];
}

kbit_status fail(kbit_status status, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    std::vsnprintf(g_last_error, sizeof g_last_error, fmt, args);
    va_end(args);
    return status;
}

void clear_error() { g_last_error[0] = '\0'; }

}  // namespace kbit

extern "C" {

KBIT_API int kbit_version(void) { return KBIT_VERSION_CODE; }

KBIT_API const char *kbit_status_string(kbit_status status) {
    switch (status) {
        case KBIT_SUCCESS: return "KBIT_SUCCESS";
        case KBIT_ERROR_INVALID_ARGUMENT: return "KBIT_ERROR_INVALID_ARGUMENT";
        case KBIT_ERROR_NULL_POINTER: return "KBIT_ERROR_NULL_POINTER";
        case KBIT_ERROR_MISALIGNED: return "KBIT_ERROR_MISALIGNED";
        case KBIT_ERROR_RANGE: return "KBIT_ERROR_RANGE";
        case KBIT_ERROR_NOT_SUPPORTED: return "KBIT_ERROR_NOT_SUPPORTED";
        case KBIT_ERROR_NO_DEVICE: return "KBIT_ERROR_NO_DEVICE";
        case KBIT_ERROR_CUDA: return "KBIT_ERROR_CUDA";
        case KBIT_ERROR_INVALID_DATA: return "KBIT_ERROR_INVALID_DATA";
        case KBIT_ERROR_INTERNAL: return "KBIT_ERROR_INTERNAL";
    }
    return "unknown status";
}

KBIT_API const char *kbit_last_error_message(void) {
    return kbit::g_last_error;
}

}  // extern "C"
