package ipvsmode

import "testing"

// TestCloseReleasesTheKernel checks that Close releases the Handles the
// Mode was made with.
func TestCloseReleasesTheKernel(t *testing.T) {
	released := 0
	k := &Handles{Release: func() { released++ }}
	b := &Mode{node: k}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if released != 1 {
		t.Errorf("released %d times, want 1", released)
	}
	var nilKernel *Handles
	nilKernel.Close() // must not panic
}
