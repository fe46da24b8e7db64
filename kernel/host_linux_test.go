package kernel

import (
	"errors"
	"testing"

	"k8s.io/klog/v2/ktesting"
)

// TestHostKernel reads the real machine's kernel, with no exec, so it only
// reads: the parsers must cope with the real files, whatever node this is.
func TestHostKernel(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	k := &Kernel{}
	v, err := k.Version()
	if err != nil {
		t.Fatalf("host kernel version: %v", err)
	}
	m, err := k.Modules(ctx)
	if err != nil {
		t.Skipf("host kernel %s does not say which modules it has: %v", v, err)
	}
	t.Logf("host kernel %s: loadable modules %v, %d loaded, %d in modules.builtin, config from %q",
		v, m.Loadable, len(m.Loaded), len(m.BuiltIn), m.ConfigPath)
	if !m.Loadable && m.ConfigPath != "" && !m.Has("nf_conntrack") && m.Config["CONFIG_NF_CONNTRACK"] == "y" {
		t.Errorf("config says CONFIG_NF_CONNTRACK=y but Has(nf_conntrack) is false")
	}
	err = k.CanUseIPVS(ctx)
	var ue *IPVSUnavailableError
	if err != nil && !errors.As(err, &ue) {
		t.Fatalf("CanUseIPVS on the host: %v", err)
	}
	t.Logf("CanUseIPVS on the host: %v", err)
}
