package master

import (
	"testing"
	"time"

	"github.com/concord-ccl/concord/internal/wire"
	"github.com/concord-ccl/concord/sharedstate"
)

// FuzzMasterMachine drives the master machine with arbitrary interleavings of the inputs peers and the
// server can give it (Hellos with and without Resume reports, votes, Dones, syncs, steps, bandwidth
// reports, closes, ticks, stalls, time, and any message the wire decoder accepts) and checks after every
// step what must always hold (checkInvariants): no panic, accepted peers in the ring, epochs of the
// incarnation, and so on. Each input is two bytes: the input kind and an argument.
func FuzzMasterMachine(f *testing.F) {
	f.Add([]byte{0, 1, 2, 1, 0, 2, 0, 3, 3, 1, 2, 2, 2, 3, 2, 1, 4, 1, 4, 2, 4, 3})
	f.Add([]byte{1, 1, 1, 2, 1, 3, 2, 1, 2, 2, 2, 3, 4, 1, 4, 2, 5, 1, 6, 2, 12, 40, 11, 9})
	f.Add([]byte{0, 1, 2, 1, 0, 2, 3, 1, 2, 1, 2, 2, 7, 1, 7, 2, 8, 1, 8, 2, 9, 1, 13, 200, 12, 0})
	f.Fuzz(fuzzMaster)
}

func fuzzMaster(t *testing.T, script []byte) {
	{
		now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		cfg := Config{Token: "tok", MinPeers: 2, Incarnation: 2, MaxPeers: 6, MaxOpsPerPeer: 3,
			Guard: GuardPolicy{RejectNonFinite: true, NormFactor: 4, Exclude: len(script)%2 == 0}}
		m := New(cfg)
		step := func(in Input) {
			actions := m.Step(now, in)
			for len(actions) > 0 {
				a := actions[0]
				actions = actions[1:]
				if sv, ok := a.(Solve); ok {
					actions = append(actions, m.Step(now, Solved{ID: sv.ID})...) // the solve failed
				}
			}
		}
		for i := 0; i+1 < len(script); i += 2 {
			kind, arg := script[i]%16, script[i+1]
			c := ConnID(arg%6 + 1)
			epoch := epochOf(2, uint32(arg/6%4))
			switch kind {
			case 0:
				step(Received{c, &wire.Hello{Token: "tok", Addr: "10.0.0.1:1", Peer: uint64(arg % 8)}})
			case 1:
				ring := []uint64{uint64(arg%3 + 1), uint64(arg%5 + 1), 3}
				step(Received{c, &wire.Hello{Token: "tok", Addr: "10.0.0.1:1", Peer: uint64(c),
					Resume: &wire.Resume{Incarnation: uint64(arg % 3), Epoch: uint64(arg), Ring: ring, Revision: uint64(arg % 4),
						Digest: sharedstate.EncodeDigest(sharedstate.Digest{Revision: uint64(arg % 4),
							Entries: []sharedstate.EntryDigest{{Name: "w", DType: 10, Count: 4, Hash: uint64(arg % 3)}}})}}})
			case 2:
				step(Received{c, &wire.LinksReady{Epoch: epoch, OK: arg%5 != 0, Failed: []uint64{uint64(arg % 4)}}})
			case 3:
				step(Received{c, &wire.VoteTopology{Rewire: arg%2 == 0, NoAdmit: arg%3 == 0}})
			case 4:
				var st *wire.Contribution
				if arg%3 != 0 {
					st = &wire.Contribution{Finite: arg%7 != 0, Norm: float64(arg % 11)}
				}
				step(Received{c, &wire.Initiate{Tag: uint64(arg % 4), Desc: wire.Desc{Count: 4, DType: 10}, Stats: st}})
			case 5:
				step(Received{c, &wire.Done{Tag: uint64(arg % 4), Seq: uint64(arg%3) | 2<<32, Code: wire.Code(arg % 4)}})
			case 6:
				step(Received{c, &wire.VotePending{}})
			case 7:
				d := sharedstate.Digest{Revision: uint64(arg % 3), Entries: []sharedstate.EntryDigest{{Name: "w", DType: 10, Count: 4, Hash: uint64(arg % 2)}}}
				step(Received{c, &wire.VoteSync{Strategy: arg % 3, Digest: sharedstate.EncodeDigest(d)}})
			case 8:
				step(Received{c, &wire.SyncDone{OK: arg%4 != 0}})
			case 9:
				step(Received{c, &wire.StepReport{Step: uint64(arg)}})
			case 10:
				step(Received{c, &wire.VoteOptimize{}})
			case 11:
				step(Received{c, &wire.MeasureReport{Round: uint32(arg % 3), To: uint64(arg % 4), BytesPerSec: float64(arg) * 1e6}})
			case 12:
				now = now.Add(time.Duration(arg) * 20 * time.Millisecond)
				step(Tick{})
			case 13:
				step(Stalled{Gap: time.Duration(arg) * 50 * time.Millisecond})
			case 14:
				step(Closed{c, "EOF"})
			case 15:
				// Any message the decoder accepts, from the bytes that follow.
				end := min(len(script), i+2+int(arg%32))
				if msg, err := wire.Decode(wire.Type(arg%80), script[i+2:end]); err == nil {
					step(Received{c, msg})
				}
				i = end - 2
			}
			checkInvariants(t, m, "fuzz", i/2)
		}
	}
}
