package ebpf

import (
	"fmt"
	"reflect"

	cebpf "github.com/cilium/ebpf"
)

// BatchRefusals counts what a Datapath did whose batches were refused.
type BatchRefusals struct {
	// Batches counts the batch operations refused, Elements the element
	// operations made instead.
	Batches, Elements int
}

// RefuseBatches makes d's maps refuse batch operations as a kernel
// without them does (ErrNotSupported, the count left as given), and
// returns what d did since.
func (d *Datapath) RefuseBatches() *BatchRefusals {
	d.mu.Lock()
	defer d.mu.Unlock()
	r := &BatchRefusals{}
	for _, w := range []*mapWriter{&d.svcW, &d.slotW, &d.endpointW} {
		w.m = refusing{kernelMap: w.m, r: r}
	}
	return r
}

type refusing struct {
	kernelMap
	r *BatchRefusals
}

func (m refusing) BatchUpdate(keys, _ any, _ *cebpf.BatchOptions) (int, error) {
	m.r.Batches++
	return reflect.ValueOf(keys).Len(), fmt.Errorf("batch update: %w", cebpf.ErrNotSupported)
}

func (m refusing) BatchDelete(keys any, _ *cebpf.BatchOptions) (int, error) {
	m.r.Batches++
	return reflect.ValueOf(keys).Len(), fmt.Errorf("batch delete: %w", cebpf.ErrNotSupported)
}

func (m refusing) Update(k, v any, flags cebpf.MapUpdateFlags) error {
	m.r.Elements++
	return m.kernelMap.Update(k, v, flags)
}

func (m refusing) Delete(k any) error {
	m.r.Elements++
	return m.kernelMap.Delete(k)
}
