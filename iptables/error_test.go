package iptables

import (
	"errors"
	"fmt"
	"testing"
)

func TestRestoreLine(t *testing.T) {
	for _, tc := range []struct {
		stderr string
		want   int
	}{
		{"iptables-restore: line 3 failed", 3},
		{"iptables-restore v1.8.9 (legacy): unknown option \"--bogus\"\nError occurred at line: 7\nTry `iptables-restore -h'", 7},
		{"iptables-restore: COMMIT expected at line 4", 4},
		{"iptables-nft-restore v1.8.9 (nf_tables): \nline 22: RULE_APPEND failed (Invalid argument): rule in chain INPUT", 22},
		{"iptables-nft-restore: line 3 failed: Chain already exists.", 3},
		{"multiline text without numbers", 0},
		{"", 0},
	} {
		if got := restoreLine(tc.stderr); got != tc.want {
			t.Errorf("restoreLine(%q) = %d, want %d", tc.stderr, got, tc.want)
		}
	}
}

func TestErrorHelpers(t *testing.T) {
	for _, tc := range []struct {
		name          string
		err           error
		notFound      bool
		lockTimeout   bool
		wantErrString string
	}{
		{
			name:          "missing chain",
			err:           &Error{Command: "iptables", Args: []string{"-F", "X"}, ExitStatus: 1, Stderr: "iptables: No chain/target/match by that name."},
			notFound:      true,
			wantErrString: "iptables -F X: exit status 1: iptables: No chain/target/match by that name.",
		},
		{
			name:     "missing rule, wrapped",
			err:      fmt.Errorf("deleting: %w", &Error{Command: "iptables", ExitStatus: 1, Stderr: "iptables: Bad rule (does a matching rule exist in that chain?)."}),
			notFound: true,
		},
		{
			name:     "nft missing chain",
			err:      &Error{Command: "iptables-nft-restore", ExitStatus: 2, Stderr: "iptables-nft-restore v1.8.9 (nf_tables): Chain 'NOPE' does not exist"},
			notFound: true,
		},
		{
			name:        "lock",
			err:         &Error{Command: "iptables", ExitStatus: 4, Stderr: "Another app is currently holding the xtables lock. Stopped waiting after 1s."},
			lockTimeout: true,
		},
		{
			name: "lock message with another status is not a lock timeout",
			err:  &Error{Command: "iptables", ExitStatus: 1, Stderr: "Another app is currently holding the xtables lock."},
		},
		{
			name: "nft busy is not a lock timeout",
			err:  &Error{Command: "iptables-nft", ExitStatus: 4, Stderr: "CHAIN_DEL failed (Device or resource busy): chain FOO"},
		},
		{
			name:        "own lock wait",
			err:         &Error{Command: "iptables-restore", ExitStatus: -1, Err: fmt.Errorf("x: %w", errLockTimeout)},
			lockTimeout: true,
		},
		{
			name:          "not started",
			err:           &Error{Command: "iptables", Args: []string{"-L"}, ExitStatus: -1, Err: errors.New("executable file not found")},
			wantErrString: "iptables -L: executable file not found",
		},
		{name: "other error", err: errors.New("No chain/target/match by that name")},
		{name: "nil", err: nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := IsNotFound(tc.err); got != tc.notFound {
				t.Errorf("IsNotFound = %v, want %v", got, tc.notFound)
			}
			if got := errors.Is(tc.err, ErrNotFound); got != tc.notFound {
				t.Errorf("errors.Is(err, ErrNotFound) = %v, want %v", got, tc.notFound)
			}
			if IsNotSupported(tc.err) {
				t.Error("IsNotSupported = true for a command's error")
			}
			if got := IsLockTimeout(tc.err); got != tc.lockTimeout {
				t.Errorf("IsLockTimeout = %v, want %v", got, tc.lockTimeout)
			}
			if tc.wantErrString != "" && tc.err.Error() != tc.wantErrString {
				t.Errorf("Error() = %q, want %q", tc.err.Error(), tc.wantErrString)
			}
		})
	}
}

func TestIsNotSupported(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{name: "nil"},
		{name: "the sentinel", err: ErrNotSupported, want: true},
		{name: "wrapped with the OS", err: fmt.Errorf("%w on darwin", ErrNotSupported), want: true},
		{name: "a command's error", err: &Error{Command: "iptables", ExitStatus: 1, Stderr: "iptables: not supported"}},
		{name: "same text, other error", err: errors.New(ErrNotSupported.Error())},
	} {
		if got := IsNotSupported(tc.err); got != tc.want {
			t.Errorf("%s: IsNotSupported(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
	if got, want := ErrNotSupported.Error(), "iptables: not supported"; got != want {
		t.Errorf("ErrNotSupported = %q, want %q", got, want)
	}
}
