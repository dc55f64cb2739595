/*
 * ccoip.h: the well-known ports of PCCL's protocol, as PCCL installs them beside pccl.h.
 *
 * Concord's libpccl.so takes every address from its caller: a master listens where
 * pcclCreateMaster says (port 0 picks a free one, which concordMasterGetPort reads back) and a
 * peer's links and state transfers share one listening port of its own (concordSetListenAddress).
 * The numbers below are PCCL's defaults, kept so that programs written for PCCL, which pass
 * CCOIP_PROTOCOL_PORT_MASTER to pcclCreateMaster and pcclCreateCommunicator, compile unchanged.
 */
#ifndef CONCORD_CCOIP_H
#define CONCORD_CCOIP_H

#ifdef __cplusplus
#include <cstdint>
#else
#include <stdint.h>
#endif

/* The master's listening port. */
#define CCOIP_PROTOCOL_PORT_MASTER 48148

/* PCCL's per-peer ports: shared-state transfers, ring links and bandwidth tests. Concord serves all
 * three on the one port a peer listens on, so these are informational. */
#define CCOIP_PROTOCOL_PORT_SHARED_STATE 48149
#define CCOIP_PROTOCOL_PORT_P2P 48150
#define CCOIP_PROTOCOL_PORT_BANDWIDTH_BENCHMARK 48151

#endif /* CONCORD_CCOIP_H */
