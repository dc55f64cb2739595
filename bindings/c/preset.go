package main

import (
	"fmt"
	"time"

	"github.com/concord-ccl/concord/pccl"
	"github.com/concord-ccl/concord/pccl/master"
)

// The "pccl" presets are the C ABI's defaults. PCCL has no heartbeats: it leaves failure detection
// to TCP, with keepalive after 60 s of idle master connection and 30 s of idle link, so a peer that
// stops for tens of seconds (a long step, a debugger, SIGSTOP) stays in the run, while a closed
// connection (a crash, a kill) aborts its operations at once. These presets give Concord the same
// patience: the master declares a silent peer gone after pcclMasterSilence, a peer gives up on a
// silent master after as long, and a collective's link may stall for pcclLinkSilence. "lan" and
// "wan" are Concord's own presets, which detect a hung peer within seconds.
const (
	pcclMasterSilence = 60 * time.Second
	pcclLinkSilence   = 30 * time.Second
	pcclHeartbeat     = time.Second
)

// presetNames lists the presets concordSetPreset and concordMasterSetPreset accept.
const presetNames = "pccl, lan or wan"

// masterPreset returns the heartbeat timing of the named master preset.
func masterPreset(name string) (interval, timeout time.Duration, err error) {
	switch name {
	case "pccl":
		return pcclHeartbeat, pcclMasterSilence, nil
	case "lan":
		c := master.LAN()
		return c.HeartbeatInterval, c.HeartbeatTimeout, nil
	case "wan":
		c := master.WAN()
		return c.HeartbeatInterval, c.HeartbeatTimeout, nil
	}
	return 0, 0, fmt.Errorf("%w: master preset %q (want %s)", pccl.ErrInvalid, name, presetNames)
}

// peerPreset returns the communicator configuration of the named preset (Master and the other
// per-peer fields left empty).
func peerPreset(name string) (pccl.Config, error) {
	switch name {
	case "pccl":
		c := pccl.LAN()
		c.MasterTimeout, c.ProgressTimeout = pcclMasterSilence, pcclLinkSilence
		return c, nil
	case "lan":
		return pccl.LAN(), nil
	case "wan":
		return pccl.WAN(), nil
	}
	return pccl.Config{}, fmt.Errorf("%w: preset %q (want %s)", pccl.ErrInvalid, name, presetNames)
}
