package pccl

import (
	"errors"
	"net"
	"testing"
)

func TestSplitAdvertise(t *testing.T) {
	for _, tc := range []struct {
		in      string
		host    string
		hasPort bool
		bad     bool
	}{
		{in: "198.18.0.2:7000", host: "198.18.0.2", hasPort: true},
		{in: "198.18.0.2", host: "198.18.0.2"},
		{in: "peer-3.example", host: "peer-3.example"},
		{in: "peer-3.example:7000", host: "peer-3.example", hasPort: true},
		{in: "[2001:2::5]:7000", host: "2001:2::5", hasPort: true},
		{in: "2001:2::5", host: "2001:2::5"},
		{in: "[2001:2::5]", host: "2001:2::5"},
		{in: ":7000", bad: true},
		{in: "host:port", bad: true},
		{in: "host:99999", bad: true},
		{in: "[nonsense]", bad: true},
		{in: "a b", bad: true},
	} {
		host, hasPort, err := splitAdvertise(tc.in)
		if tc.bad {
			if err == nil {
				t.Errorf("splitAdvertise(%q) = %q, %v; want an error", tc.in, host, hasPort)
			}
			continue
		}
		if err != nil || host != tc.host || hasPort != tc.hasPort {
			t.Errorf("splitAdvertise(%q) = %q, %v, %v; want %q, %v", tc.in, host, hasPort, err, tc.host, tc.hasPort)
		}
	}
}

func TestAdvertised(t *testing.T) {
	wild4 := &net.TCPAddr{IP: net.IPv4zero, Port: 4100}
	wild6 := &net.TCPAddr{IP: net.IPv6unspecified, Port: 4101}
	wildUDP := &net.UDPAddr{Port: 4102}
	bound := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 9), Port: 4103}
	for _, tc := range []struct {
		name      string
		advertise string
		bound     net.Addr
		master    string
		want      string
	}{
		{"bound address as is", "", bound, "127.0.0.1:48148", "127.0.0.9:4103"},
		{"wildcard takes the route to a loopback master", "", wild4, "127.0.0.1:48148", "127.0.0.1:4100"},
		{"IPv6 wildcard, IPv6 loopback master", "", wild6, "[::1]:48148", "[::1]:4101"},
		{"QUIC wildcard", "", wildUDP, "127.0.0.1:48148", "127.0.0.1:4102"},
		{"a DNS name for the master", "", wild4, "localhost:48148", "127.0.0.1:4100"},
		{"advertise with a port", "203.0.113.7:9000", wild4, "127.0.0.1:48148", "203.0.113.7:9000"},
		{"advertise without a port takes the listen port", "203.0.113.7", wild4, "127.0.0.1:48148", "203.0.113.7:4100"},
		{"IPv6 advertise without a port", "2001:2::7", wild6, "[::1]:48148", "[2001:2::7]:4101"},
		{"a name without a port", "peer.example", bound, "127.0.0.1:48148", "peer.example:4103"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := advertised(tc.advertise, tc.bound, tc.master)
			if err != nil || got != tc.want {
				t.Errorf("advertised(%q, %v, %q) = %q, %v; want %q", tc.advertise, tc.bound, tc.master, got, err, tc.want)
			}
		})
	}
}

func TestAdvertisedErrors(t *testing.T) {
	// A host without a port needs a listener that has one.
	_, err := advertised("peer.example", memAddrForTest("host1:7"), "master:1")
	if !errors.Is(err, ErrInvalid) {
		t.Errorf("advertise without a port on a portless listener: %v, want ErrInvalid", err)
	}
	// A wildcard with no route to the master cannot be advertised.
	_, err = advertised("", &net.TCPAddr{IP: net.IPv4zero, Port: 1}, "no-such-host.invalid:1")
	if err == nil {
		t.Error("wildcard with an unresolvable master: no error")
	}
	// A non-IP listener (the in-memory network) is advertised as it is.
	if got, err := advertised("", memAddrForTest("host1:7"), "master:1"); err != nil || got != "host1:7" {
		t.Errorf("in-memory listener: %q, %v", got, err)
	}
}

func TestConfigValidatesAdvertise(t *testing.T) {
	cfg := Config{Master: "127.0.0.1:1", AdvertiseAddr: "a:b:c"}
	if err := cfg.Validate(); !errors.Is(err, ErrInvalid) {
		t.Errorf("Validate with a bad AdvertiseAddr: %v, want ErrInvalid", err)
	}
}

type memAddrForTest string

func (a memAddrForTest) Network() string { return "mem" }
func (a memAddrForTest) String() string  { return string(a) }
