package iptablestest

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/proxykit/proxykit/iptables"
)

// serviceRestore returns kube-proxy-like nat and filter restore input with
// at least rules rules: services of 10 endpoints each, a ClusterIP rule,
// a KUBE-SVC chain choosing an endpoint at random and a KUBE-SEP chain per
// endpoint.
func serviceRestore(rules int) []byte {
	b := iptables.NewLineBuffer()
	const eps = 10
	services := rules/(2+eps+2*eps) + 1
	b.Write("*filter")
	b.Write(":KUBE-SERVICES", "-", "[0:0]")
	b.Write("-A", "INPUT", "-m", "conntrack", "--ctstate", "NEW", "-j", "KUBE-SERVICES")
	b.Write("COMMIT")
	b.Write("*nat")
	b.Write(":KUBE-SERVICES", "-", "[0:0]")
	b.Write(":KUBE-MARK-MASQ", "-", "[0:0]")
	for s := 0; s < services; s++ {
		b.Write(":KUBE-SVC-"+strconv.Itoa(s), "-", "[0:0]")
		for e := 0; e < eps; e++ {
			b.Write(fmt.Sprintf(":KUBE-SEP-%d-%d", s, e), "-", "[0:0]")
		}
	}
	b.Write("-A", "PREROUTING", "-j", "KUBE-SERVICES")
	b.Write("-A", "OUTPUT", "-j", "KUBE-SERVICES")
	b.Write("-A", "KUBE-MARK-MASQ", "-j", "MARK", "--or-mark", "0x4000")
	for s := 0; s < services; s++ {
		svc := "KUBE-SVC-" + strconv.Itoa(s)
		ip := fmt.Sprintf("10.96.%d.%d", s/256, s%256)
		b.Write("-A", "KUBE-SERVICES", "-m", "comment", "--comment", `"ns/svc-`+strconv.Itoa(s)+`:http cluster IP"`,
			"-m", "tcp", "-p", "tcp", "-d", ip, "--dport", "80", "-j", svc)
		b.Write("-A", svc, "-m", "comment", "--comment", `"ns/svc:http cluster IP"`, "-m", "tcp", "-p", "tcp",
			"-d", ip, "--dport", "80", "!", "-s", "10.244.0.0/16", "-j", "KUBE-MARK-MASQ")
		for e := 0; e < eps; e++ {
			sep := fmt.Sprintf("KUBE-SEP-%d-%d", s, e)
			epIP := fmt.Sprintf("10.%d.%d.%d", 128+s/65536, s/256%256, s%256)
			if e < eps-1 {
				b.Write("-A", svc, "-m", "statistic", "--mode", "random", "--probability", strconv.FormatFloat(1/float64(eps-e), 'f', 10, 64), "-j", sep)
			} else {
				b.Write("-A", svc, "-j", sep)
			}
			b.Write("-A", sep, "-s", epIP, "-j", "KUBE-MARK-MASQ")
			b.Write("-A", sep, "-m", "tcp", "-p", "tcp", "-j", "DNAT", "--to-destination", epIP+":"+strconv.Itoa(8000+e))
		}
	}
	b.Write("COMMIT")
	return b.Bytes()
}

func BenchmarkFakeRestore(b *testing.B) {
	for _, n := range []int{1000, 10000, 100000} {
		data := serviceRestore(n)
		b.Run(strconv.Itoa(n)+"rules", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				f := NewFake()
				if err := f.RestoreAll(context.Background(), data, iptables.NoFlushTables, iptables.NoRestoreCounters); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestFakeRestoreLoadsLargeInput checks that the benchmark's input is
// valid and really as large as it says.
func TestFakeRestoreLoadsLargeInput(t *testing.T) {
	f := NewFake()
	if err := f.RestoreAll(context.Background(), serviceRestore(10000), iptables.NoFlushTables, iptables.NoRestoreCounters); err != nil {
		t.Fatal(err)
	}
	if rules := strings.Count(f.Dump(), "\n-A "); rules < 10000 {
		t.Errorf("only %d rules", rules)
	}
	// A partial restore of one service touches only its chains.
	partial := "*nat\n:KUBE-SVC-7 - [0:0]\n-A KUBE-SVC-7 -j KUBE-SEP-7-3\nCOMMIT\n"
	if err := f.RestoreAll(context.Background(), []byte(partial), iptables.NoFlushTables, iptables.NoRestoreCounters); err != nil {
		t.Fatal(err)
	}
	if got := f.Rules(iptables.TableNAT, "KUBE-SVC-7"); len(got) != 1 || len(f.Rules(iptables.TableNAT, "KUBE-SVC-8")) != 11 {
		t.Errorf("partial restore: KUBE-SVC-7 = %v, KUBE-SVC-8 has %d rules", got, len(f.Rules(iptables.TableNAT, "KUBE-SVC-8")))
	}
}
