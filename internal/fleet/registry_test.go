package fleet

import (
	"context"
	"fmt"
	"testing"

	"github.com/drover/drover/internal/protocol"
)

// Devices registered across slab boundaries are found by machine ID and by
// ID, each its own record; a deleted one is gone from the index.
func TestRegistryAcrossSlabs(t *testing.T) {
	ctx := context.Background()
	s, err := New(ctx, Stores{}, nil, Options{EnrollmentSecret: "sesame"})
	if err != nil {
		t.Fatal(err)
	}
	n := 2*deviceSlab + 3
	ids := make([]uint64, n)
	for i := range n {
		resp, err := s.Register(ctx, protocol.RegisterRequest{MachineID: fmt.Sprintf("machine-%05d", i), DeviceType: "router",
			Firmware: "1.0", Serial: fmt.Sprint("S", i), EnrollmentSecret: "sesame"})
		if err != nil {
			t.Fatal(err)
		}
		fmt.Sscan(resp.DeviceID, &ids[i])
	}
	seen := map[*device]bool{}
	for i := range n {
		mid := fmt.Sprintf("machine-%05d", i)
		id, ok := s.machineIDs.get(mid)
		if !ok || id != ids[i] {
			t.Fatalf("%s: index has %d, %v; registered as %d", mid, id, ok, ids[i])
		}
		d := s.get(id)
		if d == nil || d.machineID() != mid || d.serial() != fmt.Sprint("S", i) || seen[d] {
			t.Fatalf("%s: device record %+v (seen before: %v)", mid, d, seen[d])
		}
		seen[d] = true
	}
	if _, ok := s.machineIDs.get("machine-00000 "); ok {
		t.Fatal("a machine ID never registered is in the index")
	}
	if err := s.deleteDevice(ctx, s.get(ids[deviceSlab])); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.machineIDs.get(fmt.Sprintf("machine-%05d", deviceSlab)); ok {
		t.Fatal("a deleted device is still in the index")
	}
	// Registering the machine again makes a new device.
	resp, err := s.Register(ctx, protocol.RegisterRequest{MachineID: fmt.Sprintf("machine-%05d", deviceSlab), DeviceType: "router",
		Firmware: "1.0", EnrollmentSecret: "sesame"})
	if err != nil || resp.DeviceID == fmt.Sprint(ids[deviceSlab]) {
		t.Fatalf("registering a deleted machine again: %+v, %v", resp, err)
	}
}
