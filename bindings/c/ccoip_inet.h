/*
 * ccoip_inet.h: numeric socket addresses of the PCCL C API, as implemented by Concord.
 *
 * An address is a protocol tag, the four bytes of an IPv4 address and the sixteen bytes of an
 * IPv6 address (only the one the tag names is read), and a port in host byte order.
 */
#ifndef CONCORD_CCOIP_INET_H
#define CONCORD_CCOIP_INET_H

#ifdef __cplusplus
#include <cstdint>
extern "C" {
#else
#include <stdint.h>
#endif

/* The protocol of an address. */
typedef enum ccoip_inet_protocol_t {
    inetIPv4,
    inetIPv6
} ccoip_inet_protocol_t;

/* An IPv4 address, most significant byte first (127.0.0.1 is {127, 0, 0, 1}). */
typedef struct ccoip_ipv4_address_t {
    uint8_t data[4];
} ccoip_ipv4_address_t;

/* An IPv6 address in network byte order. */
typedef struct ccoip_ipv6_address_t {
    uint8_t data[16];
} ccoip_ipv6_address_t;

/* An IP address: protocol says which of ipv4 and ipv6 holds it. */
typedef struct ccoip_inet_address_t {
    ccoip_inet_protocol_t protocol;
    ccoip_ipv4_address_t ipv4;
    ccoip_ipv6_address_t ipv6;
} ccoip_inet_address_t;

/* An IP address and a port in host byte order. */
typedef struct ccoip_socket_address_t {
    ccoip_inet_address_t inet;
    uint16_t port;
} ccoip_socket_address_t;

#ifdef __cplusplus
}
#endif

#endif /* CONCORD_CCOIP_INET_H */
