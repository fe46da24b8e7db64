package iptables_test

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/iptables/iptablestest"
)

// restoreTextCases are texts for AppendRestoreText and AppendRestoreWord;
// ok is false for those they must refuse.
var restoreTextCases = []struct {
	text string
	ok   bool
}{
	{"default/kubernetes:https", true},
	{"", true},
	{`a"b`, true},
	{`a\b\`, true},
	{`\"`, true},
	{"x\" -j ACCEPT", true},
	{"it's", true},
	{"-t", true},
	{"!", true},
	{"#", true},
	{"tab\there", true},
	{"cr\rhere", true},
	{"\xff\xfe bytes", true},
	{"COMMIT", true},
	{strings.Repeat("\"", iptables.MaxRestoreText), true},
	{strings.Repeat("a", iptables.MaxRestoreText+1), false},
	{"new\nline", false},
	{"nul\x00byte", false},
}

// restoreTextRule is the rule a case is written in.
func restoreTextRule(t *testing.T, text string, word bool) (string, bool) {
	t.Helper()
	var b []byte
	var err error
	if word {
		b, err = iptables.AppendRestoreWord([]byte("-A KUBE-Q -m comment --comment "), text)
	} else {
		b, err = iptables.AppendRestoreText([]byte(`-A KUBE-Q -m comment --comment "`), text)
		b = append(b, '"')
	}
	if err != nil {
		if !errors.Is(err, iptables.ErrRestoreText) {
			t.Errorf("%q: error %v does not wrap ErrRestoreText", text, err)
		}
		return "", false
	}
	return string(b) + " -j ACCEPT", true
}

// wantComment is the rule iptables-save prints for a comment of text.
func wantComment(text string) string {
	if len(text) > 255 {
		text = text[:255]
	}
	return "-m comment --comment" + saveQuoted(text) + " -j ACCEPT"
}

// TestAppendRestoreText checks that what AppendRestoreText and
// AppendRestoreWord write reads back, through the strict fake's
// iptables-restore, as exactly the text given, in one word, and that they
// refuse what cannot be carried.
func TestAppendRestoreText(t *testing.T) {
	for _, word := range []bool{false, true} {
		for _, tc := range restoreTextCases {
			rule, ok := restoreTextRule(t, tc.text, word)
			if ok != tc.ok {
				t.Errorf("%q (word %v): accepted %v, want %v", tc.text, word, ok, tc.ok)
				continue
			}
			if !ok {
				continue
			}
			f := iptablestest.NewFake()
			input := "*filter\n:KUBE-Q - [0:0]\n" + rule + "\nCOMMIT\n"
			if err := f.RestoreAll(context.Background(), []byte(input), iptables.NoFlushTables, iptables.NoRestoreCounters); err != nil {
				t.Errorf("%q (word %v): %v\n%s", tc.text, word, err, input)
				continue
			}
			if diff := cmp.Diff([]string{wantComment(tc.text)}, f.Rules(iptables.TableFilter, "KUBE-Q")); diff != "" {
				t.Errorf("%q (word %v): rule (-want +got):\n%s", tc.text, word, diff)
			}
		}
	}
}

// TestAppendRestoreTextKernel is TestAppendRestoreText with the real
// iptables-restore of both backends, in a namespace.
func TestAppendRestoreTextKernel(t *testing.T) {
	for _, backend := range []iptables.Backend{iptables.BackendLegacy, iptables.BackendNFT} {
		t.Run(string(backend), func(t *testing.T) {
			kerneltest.Require(t, kernelTools(backend)...)
			ns := kerneltest.NewNS(t)
			lock := "XTABLES_LOCKFILE=" + t.TempDir() + "/xtables.lock"
			run := func(stdin string, tool string, args ...string) (string, error) {
				var out string
				err := ns.Do(func() error {
					cmd := exec.Command("iptables-"+string(backend)+tool, args...)
					cmd.Env = append(cmd.Environ(), lock)
					cmd.Stdin = strings.NewReader(stdin)
					b, err := cmd.CombinedOutput()
					out = string(b)
					return err
				})
				return out, err
			}
			for _, word := range []bool{false, true} {
				for _, tc := range restoreTextCases {
					rule, ok := restoreTextRule(t, tc.text, word)
					if !ok {
						continue
					}
					input := "*filter\n:KUBE-Q - [0:0]\n" + rule + "\nCOMMIT\n"
					if out, err := run(input, "-restore", "-w", "--noflush"); err != nil {
						t.Errorf("%q (word %v): %v: %s", tc.text, word, err, out)
						continue
					}
					save, err := run("", "-save", "-t", "filter")
					if err != nil {
						t.Fatal(err)
					}
					want := "-A KUBE-Q " + wantComment(tc.text) + "\n"
					if !strings.Contains(save, want) {
						t.Errorf("%q (word %v): the kernel holds\n%s\nwant %q", tc.text, word, save, want)
					}
					if _, err := run("*filter\n:KUBE-Q - [0:0]\n-X KUBE-Q\nCOMMIT\n", "-restore", "-w", "--noflush"); err != nil {
						t.Fatal(err)
					}
				}
			}
		})
	}
}
