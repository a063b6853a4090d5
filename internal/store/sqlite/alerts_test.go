package sqlite

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/drover/drover/internal/alert/alerttest"
	"github.com/drover/drover/internal/fleet"
)

func TestAlertStore(t *testing.T) {
	s, err := Open(context.Background(), filepath.Join(t.TempDir(), "a.db"), false)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	alerttest.Run(t, s)
}

func TestLabelStore(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "l.db")
	s, err := Open(ctx, path, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []fleet.Label{{ID: 1, Name: "north"}, {ID: 2, Name: "south"}} {
		if err := s.CreateLabel(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.CreateLabel(ctx, fleet.Label{ID: 3, Name: "north"}); err == nil {
		t.Fatal("duplicate label name accepted")
	}
	if err := s.AssignLabel(ctx, 1, []uint64{10, 11, 12}, true); err != nil {
		t.Fatal(err)
	}
	if err := s.AssignLabel(ctx, 1, []uint64{12, 13}, true); err != nil { // 12 again: no error
		t.Fatal(err)
	}
	if err := s.AssignLabel(ctx, 2, []uint64{10}, true); err != nil {
		t.Fatal(err)
	}
	if err := s.AssignLabel(ctx, 1, []uint64{11}, false); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteLabel(ctx, 2); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s, err = Open(ctx, path, false)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got := map[uint64]uint16{}
	labels, err := s.LoadLabels(ctx, func(dev uint64, id uint16) error {
		if _, dup := got[dev]; dup {
			t.Errorf("device %d twice", dev)
		}
		got[dev] = id
		return nil
	})
	if err != nil || len(labels) != 1 || labels[0] != (fleet.Label{ID: 1, Name: "north"}) {
		t.Fatalf("labels %+v %v", labels, err)
	}
	if len(got) != 3 || got[10] != 1 || got[12] != 1 || got[13] != 1 {
		t.Fatalf("assignments %v", got)
	}
}
