/* The system's librdmacm ABI (Debian: librdmacm-dev), for bindgen. */
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
