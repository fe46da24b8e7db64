package proxier

import (
	"bytes"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2/textlogger"
)

// TestServiceCIDRRefusalLogIsOneLine checks that a refused ServiceCIDR
// whose name and CIDR hold line breaks and carriage returns is logged on
// one line, its text escaped, so that it cannot forge log lines.
func TestServiceCIDRRefusalLogIsOneLine(t *testing.T) {
	var buf bytes.Buffer
	logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(&buf)))
	s := newServiceCIDRs(logger, func(v1.IPFamily) {})
	const forged = "\nE1127 00:00:00.000000       1 forged.go:1] \"forged\"\r"
	s.OnServiceCIDRAdd(&networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "bad" + forged},
		Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.96.0.0/16" + forged}}})
	out := buf.String()
	if n := strings.Count(out, "\n"); n != 1 {
		t.Errorf("%d lines, want 1 (the refusal):\n%s", n, out)
	}
	if strings.Contains(out, "\r") || strings.Contains(out, "\nE1127 00:00:00") {
		t.Errorf("the log holds a forged line or a carriage return:\n%q", out)
	}
}
