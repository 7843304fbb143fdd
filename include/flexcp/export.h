// Symbol visibility: the library is built with hidden symbols; only what carries FLEXCP_API is
// exported.
#pragma once

#if defined(FLEXCP_BUILDING_LIBRARY)
#define FLEXCP_API __attribute__((visibility("default")))
#else
#define FLEXCP_API
#endif
