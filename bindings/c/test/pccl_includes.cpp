// pccl_includes: a C++ program written the way PCCL's own C++ tests are (their includes, designated
// initializers, CCOIP_PROTOCOL_PORT_MASTER), built with -I bindings/c alone. It creates and destroys
// a communicator and a master without any I/O, so it needs no network and no fixed port.
#include <ccoip.h>
#include <pccl.h>

#include <cassert>
#include <cstdlib>
#include <iostream>
#include <thread>
#include <vector>

#define PCCL_CHECK(status)                                                \
    {                                                                     \
        pcclResult_t status_val = status;                                 \
        if (status_val != pcclSuccess) {                                  \
            std::cerr << "Error: " << status_val << std::endl;            \
            std::exit(1);                                                 \
        }                                                                 \
    }

int main() {
    PCCL_CHECK(pcclInit());
    constexpr pcclCommCreateParams_t params{
        .master_address = {.inet = {.protocol = inetIPv4, .ipv4 = {127, 0, 0, 1}}, .port = CCOIP_PROTOCOL_PORT_MASTER},
        .peer_group = 0,
        .p2p_connection_pool_size = 1,
    };
    pcclComm_t *communicator{};
    PCCL_CHECK(pcclCreateCommunicator(&params, &communicator));
    PCCL_CHECK(pcclDestroyCommunicator(communicator));

    pcclMasterInstance_t *master{};
    const ccoip_socket_address_t listen{.inet = {.protocol = inetIPv4, .ipv4 = {0, 0, 0, 0}}, .port = CCOIP_PROTOCOL_PORT_MASTER};
    PCCL_CHECK(pcclCreateMaster(listen, &master));
    PCCL_CHECK(pcclDestroyMaster(master));

    pcclReduceDescriptor_t desc{
        .count = 16,
        .op = pcclSum,
        .tag = 0,
        .src_descriptor = {.datatype = pcclFloat, .distribution_hint = pcclDistributionNone},
        .quantization_options = {.quantized_datatype = pcclFloat, .algorithm = pcclQuantNone},
    };
    std::vector<pcclAsyncReduceOp_t> ops{};
    assert(desc.count == 16 && ops.empty());
    static_assert(CCOIP_PROTOCOL_PORT_SHARED_STATE == CCOIP_PROTOCOL_PORT_MASTER + 1);
    static_assert(CCOIP_PROTOCOL_PORT_P2P == CCOIP_PROTOCOL_PORT_MASTER + 2);
    static_assert(CCOIP_PROTOCOL_PORT_BANDWIDTH_BENCHMARK == CCOIP_PROTOCOL_PORT_MASTER + 3);
    std::cout << "PASS" << std::endl;
    return 0;
}
