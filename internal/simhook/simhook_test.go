package simhook

import (
	"context"
	"testing"
	"testing/synctest"
	"time"
)

func TestGateShutsAndOpens(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewGate()
		select {
		case <-g.Shutting():
			t.Fatal("a new gate is shut")
		default:
		}
		g.Shut()
		g.Shut() // twice is once
		select {
		case <-g.Shutting():
		default:
			t.Fatal("a shut gate does not say so")
		}
		passed := make(chan time.Time)
		go func() {
			g.Wait(context.Background())
			passed <- time.Now()
		}()
		start := time.Now()
		time.Sleep(3 * time.Second)
		g.Open()
		g.Open()
		if at := <-passed; at.Sub(start) != 3*time.Second {
			t.Fatalf("Wait returned after %v, want 3s (when the gate opened)", at.Sub(start))
		}
		select {
		case <-g.Shutting():
			t.Fatal("an opened gate is still shut")
		default:
		}
		g.Wait(context.Background()) // open: returns at once
	})
}

func TestGateWaitEndsWithContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewGate()
		g.Shut()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		g.Wait(ctx)
		if ctx.Err() == nil {
			t.Fatal("Wait returned before the gate opened or the context ended")
		}
	})
}

func TestHooksTravelInTheContext(t *testing.T) {
	ctx := context.Background()
	if WallOffset(ctx) != nil || GateOf(ctx) != nil {
		t.Fatal("a bare context carries hooks")
	}
	g := NewGate()
	ctx = WithGate(WithWallOffset(ctx, func() time.Duration { return time.Hour }), g)
	if GateOf(ctx) != g {
		t.Fatal("the gate did not travel")
	}
	if f := WallOffset(ctx); f == nil || f() != time.Hour {
		t.Fatal("the wall offset did not travel")
	}
}

func TestPlantedBugsTravelInTheContext(t *testing.T) {
	ctx := context.Background()
	if Planted(ctx, "x") {
		t.Fatal("a bare context plants a bug")
	}
	ctx = WithPlanted(ctx, "x", "y")
	if !Planted(ctx, "x") || !Planted(ctx, "y") || Planted(ctx, "z") {
		t.Fatal("the planted bugs did not travel as given")
	}
}
