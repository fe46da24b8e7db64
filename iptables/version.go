package iptables

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Version is an iptables version, such as 1.8.9.
type Version struct {
	// Major, Minor and Patch are the numbers of "1.8.9", in order.
	Major, Minor, Patch int
}

// String returns the version as "1.8.9".
func (v Version) String() string {
	return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch)
}

// AtLeast reports whether v is o or newer.
func (v Version) AtLeast(o Version) bool {
	if v.Major != o.Major {
		return v.Major > o.Major
	}
	if v.Minor != o.Minor {
		return v.Minor > o.Minor
	}
	return v.Patch >= o.Patch
}

// ParseVersion reads a version from the output of "iptables --version"
// ("iptables v1.8.9 (nf_tables)", "ip6tables v1.4.21") or from a bare
// version ("1.8.9", "v1.6"). A missing patch level is 0. Anything else is
// an error.
func ParseVersion(s string) (Version, error) {
	v, _, err := parseVersionOutput(s)
	return v, err
}

// parseVersionOutput parses "iptables v1.8.9 (nf_tables)" into the
// version and the mode in parentheses ("nf_tables", "legacy", or "" for
// old binaries that print none).
func parseVersionOutput(out string) (Version, string, error) {
	fields := strings.Fields(out)
	var word string
	var mode string
	for i, f := range fields {
		t := strings.TrimPrefix(f, "v")
		if t != "" && t[0] >= '0' && t[0] <= '9' && word == "" {
			word = t
			if i+1 < len(fields) && strings.HasPrefix(fields[i+1], "(") {
				mode = strings.Trim(fields[i+1], "()")
			}
		}
	}
	if word == "" {
		return Version{}, "", fmt.Errorf("no iptables version in %q", strings.TrimSpace(out))
	}
	parts := strings.Split(word, ".")
	if len(parts) < 2 || len(parts) > 3 {
		return Version{}, "", fmt.Errorf("malformed iptables version %q", word)
	}
	var n [3]int
	for i, p := range parts {
		v, err := strconv.Atoi(p)
		if err != nil || v < 0 {
			return Version{}, "", fmt.Errorf("malformed iptables version %q", word)
		}
		n[i] = v
	}
	return Version{n[0], n[1], n[2]}, mode, nil
}

// Versions at which iptables gained (or lost) the features this package
// uses.
var (
	// -C, to check whether a rule exists.
	minCheckVersion = Version{1, 4, 11}
	// -w, wait for the xtables lock forever.
	minWaitVersion = Version{1, 4, 20}
	// -w SECONDS.
	minWaitSecondsVersion = Version{1, 4, 22}
	// -W USECS, how often to retry the lock; ignored with a warning from
	// 1.8.8, when waiting became signal driven.
	minWaitIntervalVersion        = Version{1, 6, 1}
	deprecatedWaitIntervalVersion = Version{1, 8, 8}
	// iptables-restore -w and -W.
	minRestoreWaitVersion = Version{1, 6, 2}
	// MASQUERADE/SNAT --random-fully.
	minRandomFullyVersion = Version{1, 6, 2}
	// The xtables lock moved from an abstract socket to a file.
	minLockFileVersion = Version{1, 6, 0}
)

// waitIntervalUsecs is what -W asks for: retry the lock every 100ms.
const waitIntervalUsecs = "100000"

// features are what a given iptables version can do.
type features struct {
	// hasCheck: -C works.
	hasCheck bool
	// waitFlag is prepended to every iptables command; nil before 1.4.20.
	waitFlag []string
	// restoreWaitFlag is prepended to every iptables-restore command; nil
	// before 1.6.2, when proxykit takes the lock itself.
	restoreWaitFlag []string
	// randomFully: MASQUERADE --random-fully works.
	randomFully bool
	// lockFile: the xtables lock is a file (1.6.0+) rather than an
	// abstract socket.
	lockFile bool
}

// featuresOf returns what version v can do, with wait as the time to wait
// for the xtables lock.
func featuresOf(v Version, wait time.Duration) features {
	secs := int((wait + time.Second - 1) / time.Second)
	if secs < 1 {
		secs = 1
	}
	f := features{
		hasCheck:    v.AtLeast(minCheckVersion),
		randomFully: v.AtLeast(minRandomFullyVersion),
		lockFile:    v.AtLeast(minLockFileVersion),
	}
	waitWithSeconds := []string{"-w", strconv.Itoa(secs)}
	if v.AtLeast(minWaitIntervalVersion) && !v.AtLeast(deprecatedWaitIntervalVersion) {
		waitWithSeconds = append(waitWithSeconds, "-W", waitIntervalUsecs)
	}
	switch {
	case v.AtLeast(minWaitSecondsVersion):
		f.waitFlag = waitWithSeconds
	case v.AtLeast(minWaitVersion):
		f.waitFlag = []string{"-w"}
	}
	if v.AtLeast(minRestoreWaitVersion) {
		f.restoreWaitFlag = waitWithSeconds
	}
	return f
}
