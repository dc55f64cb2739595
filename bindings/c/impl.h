/* impl.h: the library's own view of pccl.h (the opaque handles' layout). Not for applications. */
#ifndef CONCORD_IMPL_H
#define CONCORD_IMPL_H

#define CONCORD_IMPLEMENTATION
#include <stdlib.h>
#include "pccl.h"

/* A communicator or master handed to C: a cgo.Handle to the Go object, never a Go pointer. */
struct pcclComm_t {
    uintptr_t handle;
};
struct pcclMasterInstanceState_t {
    uintptr_t handle;
};

#endif
