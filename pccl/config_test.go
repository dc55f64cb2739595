package pccl

import (
	"errors"
	"testing"

	"github.com/concord-ccl/concord/pccl/internal/links"
	"github.com/concord-ccl/concord/rings"
)

// TestPartBytes checks the part size's bounds and the presets' choices: every part must fit in one
// data frame, the LAN preset cuts 4 MiB parts, and the WAN preset and the zero value rings' default.
func TestPartBytes(t *testing.T) {
	for _, tc := range []struct {
		part int
		ok   bool
	}{{0, true}, {4096, true}, {links.MaxPayload, true}, {links.MaxPayload + 1, false}, {-1, false}} {
		err := Config{Master: "m:1", PartBytes: tc.part}.Validate()
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrInvalid)) {
			t.Errorf("PartBytes %d: %v", tc.part, err)
		}
	}
	if got := LAN().PartBytes; got != 4<<20 {
		t.Errorf("LAN preset: PartBytes %d, want 4 MiB", got)
	}
	if got := WAN().PartBytes; got != rings.DefaultPartBytes {
		t.Errorf("WAN preset: PartBytes %d, want %d", got, rings.DefaultPartBytes)
	}
	if got := (Config{}).withDefaults().PartBytes; got != rings.DefaultPartBytes {
		t.Errorf("zero Config: part bytes %d, want %d", got, rings.DefaultPartBytes)
	}
}

func TestValidateNICs(t *testing.T) {
	for _, tc := range []struct {
		nics []string
		ok   bool
	}{
		{nil, true},
		{[]string{"eth0", "10.0.0.2"}, true},
		{[]string{"eth0", ""}, false},
		{[]string{"eth0", "eth1", "eth0"}, false},
	} {
		err := Config{Master: "m:1", NICs: tc.nics}.Validate()
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrInvalid)) {
			t.Errorf("NICs %q: %v", tc.nics, err)
		}
	}
}
