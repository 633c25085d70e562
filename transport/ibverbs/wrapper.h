/* The system's libibverbs ABI (Debian: libibverbs-dev), for bindgen. */
#include <infiniband/verbs.h>
