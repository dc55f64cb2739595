"""A data-parallel training loop written against PCCL's C API through cffi, the way PCCL's Python
package drives libpccl.so; it knows nothing of Concord.

argv: libpccl.so path, master port, peer index, steps. Each step: update the topology (not on the
first; the first step waits for all three peers), sync the weights as shared state (revision = step), all-reduce (average) this peer's gradient
(index + 1 everywhere) with retry while more than one peer is left, check every element against the
world size the all-reduce reports, and apply it. At the end it prints the weights' hash.
"""

import faulthandler

faulthandler.dump_traceback_later(100, exit=True)  # a hang shows where it is

import hashlib
import sys

import numpy as np

from pccl_cdecls import load, loopback

path, port, me, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
ffi, lib = load(path)


def ok(rc, what):
    if rc != lib.pcclSuccess:
        raise SystemExit(f"peer {me}: {what} returned {rc}")


params = ffi.new("pcclCommCreateParams_t *")
params.master_address = loopback(ffi, port)[0]
params.peer_group = 0
params.p2p_connection_pool_size = 1
comm_p = ffi.new("pcclComm_t **")
ok(lib.pcclCreateCommunicator(params, comm_p), "pcclCreateCommunicator")
comm = comm_p[0]
ok(lib.pcclConnect(comm), "pcclConnect")

N = 100_003
weights = np.zeros(N, dtype=np.float32)
grads = np.empty(N, dtype=np.float32)
world = ffi.new("int *")
name = ffi.new("char[]", b"weights")
infos = ffi.new("pcclTensorInfo_t[1]")
infos[0].name = name
infos[0].data = ffi.cast("void *", weights.ctypes.data)
infos[0].count = N
infos[0].datatype = lib.pcclFloat
infos[0].device_type = lib.pcclDeviceCpu
infos[0].allow_content_inequality = False
state = ffi.new("pcclSharedState_t *")
state.count = 1
state.infos = infos
desc = ffi.new("pcclReduceDescriptor_t *")
desc.count = N
desc.op = lib.pcclAvg
desc.tag = 0
desc.src_descriptor.datatype = lib.pcclFloat
desc.src_descriptor.distribution_hint = lib.pcclDistributionNone
desc.quantization_options.quantized_datatype = lib.pcclFloat
desc.quantization_options.algorithm = lib.pcclQuantNone
info = ffi.new("pcclReduceInfo_t *")
sync_info = ffi.new("pcclSharedStateSyncInfo_t *")
gp = ffi.cast("void *", grads.ctypes.data)

step = 0
first = True
while step < steps:
    if not first:
        ok(lib.pcclUpdateTopology(comm), "pcclUpdateTopology")
    first = False
    ok(lib.pcclGetAttribute(comm, lib.PCCL_ATTRIBUTE_GLOBAL_WORLD_SIZE, world), "pcclGetAttribute")
    if world[0] < (3 if step == 0 else 2):  # start with all three, go on while two are left
        continue
    state.revision = step + 1
    ok(lib.pcclSynchronizeSharedState(comm, state, lib.PCCL_SHARED_STATE_SYNC_STRATEGY_ENFORCE_POPULAR, sync_info),
       "pcclSynchronizeSharedState")
    if step > 0 and sync_info.rx_bytes != 0:
        raise SystemExit(f"peer {me}: weights diverged at step {step}")
    print(f"peer {me}: step {step} world {world[0]}", flush=True)
    retried = False
    while True:
        grads.fill(me + 1)
        rc = lib.pcclAllReduce(gp, gp, desc, comm, info)
        if rc == lib.pcclSuccess:
            break
        if rc != lib.pcclRankConnectionLost:
            raise SystemExit(f"peer {me}: pcclAllReduce returned {rc}")
        retried = True
        ok(lib.pcclGetAttribute(comm, lib.PCCL_ATTRIBUTE_GLOBAL_WORLD_SIZE, world), "pcclGetAttribute")
        if world[0] < 2:
            break
    if retried:
        print(f"peer {me}: retried at step {step}, world {info.local_world_size}", flush=True)
    want = {3: 2.0, 2: 1.5}[info.local_world_size]
    if not np.all(grads == np.float32(want)):
        raise SystemExit(f"peer {me}: step {step}: average {grads[:3]} with world {info.local_world_size}")
    weights -= np.float32(0.01) * grads
    step += 1

ok(lib.pcclDestroyCommunicator(comm), "pcclDestroyCommunicator")
print(f"peer {me}: done hash {hashlib.sha256(weights.tobytes()).hexdigest()}", flush=True)
