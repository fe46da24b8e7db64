package ebpf

import "context"

// CheckDrift runs one drift check of Run, for the tests of package
// ebpf_test.
func (b *Mode) CheckDrift(ctx context.Context, lost func()) { b.checkDrift(ctx, lost) }
