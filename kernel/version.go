package kernel

import (
	"fmt"
	"strconv"
	"strings"
)

// osreleasePath holds the running kernel's release string, as `uname -r`
// prints it.
const osreleasePath = "/proc/sys/kernel/osrelease"

// Version is a kernel release such as "6.1.0-56-cloud-amd64": the numeric
// major.minor.patch that the kernel's features depend on, and the rest as
// the distribution wrote it. The zero Version is not a valid release.
type Version struct {
	// Major, Minor and Patch are the leading numbers; Patch is 0 when the
	// release has only two ("4.19-foo").
	Major, Minor, Patch int
	// Release is the whole release string, trimmed of white space, as it
	// appears in paths like /lib/modules/<Release> and /boot/config-<Release>.
	Release string
}

// ParseVersion parses a kernel release string leniently: it needs a leading
// "MAJOR.MINOR" and takes an optional ".PATCH"; anything after that, such as
// a fourth number, "-56-cloud-amd64", ".el7.x86_64" or "+", is kept in
// Release but does not affect comparisons. Surrounding white space is
// ignored. It returns an error for a string without two leading numbers or
// with a number too large for an int.
func ParseVersion(s string) (Version, error) {
	release := strings.TrimSpace(s)
	rest := release
	var nums []int
	for len(nums) < 3 {
		digits := leadingDigits(rest)
		if digits == "" {
			break
		}
		n, err := strconv.Atoi(digits)
		if err != nil {
			return Version{}, fmt.Errorf("kernel version %q: %w", release, err)
		}
		nums = append(nums, n)
		rest = rest[len(digits):]
		// Only a dot followed by a digit continues the numeric part:
		// "4.19." and "4.19.x" have no patch number.
		if len(rest) < 2 || rest[0] != '.' || leadingDigits(rest[1:2]) == "" {
			break
		}
		rest = rest[1:]
	}
	if len(nums) < 2 {
		return Version{}, fmt.Errorf("kernel version %q: want MAJOR.MINOR at the start", release)
	}
	v := Version{Major: nums[0], Minor: nums[1], Release: release}
	if len(nums) == 3 {
		v.Patch = nums[2]
	}
	return v, nil
}

func leadingDigits(s string) string {
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return s[:i]
}

// String returns Release, or "MAJOR.MINOR.PATCH" for a Version made by hand
// without one.
func (v Version) String() string {
	if v.Release != "" {
		return v.Release
	}
	return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch)
}

// Compare compares the numeric parts of v and o: -1 if v is older, +1 if it
// is newer, 0 if they are the same release line (whatever their suffixes).
func (v Version) Compare(o Version) int {
	for _, d := range [3]int{v.Major - o.Major, v.Minor - o.Minor, v.Patch - o.Patch} {
		switch {
		case d < 0:
			return -1
		case d > 0:
			return 1
		}
	}
	return 0
}

// AtLeast reports whether v is o or newer, comparing the numeric parts only
// as [Version.Compare] does: AtLeast(Version{Major: 4, Minor: 19}) holds for
// every 4.19 release.
func (v Version) AtLeast(o Version) bool {
	return v.Compare(o) >= 0
}

// Version returns the running kernel's release, read from
// /proc/sys/kernel/osrelease under k.Root. It fails if the file is missing
// or does not start with MAJOR.MINOR.
func (k *Kernel) Version() (Version, error) {
	data, err := k.readFile(osreleasePath)
	if err != nil {
		return Version{}, err
	}
	return ParseVersion(string(data))
}
