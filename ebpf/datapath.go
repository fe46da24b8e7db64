package ebpf

import (
	"fmt"
	"path/filepath"

	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/internal/logsafe"
)

// DefaultPinPath is the bpffs directory the maps and links are pinned
// under when DatapathConfig.PinPath is "".
const DefaultPinPath = "/sys/fs/bpf"

// DefaultNamePrefix starts the name of everything pinned when
// DatapathConfig.NamePrefix is "".
const DefaultNamePrefix = "proxykit"

// DatapathConfig says where one family's programs and maps live.
type DatapathConfig struct {
	// Family is v1.IPv4Protocol (the connect4, sendmsg4, recvmsg4 and
	// getpeername4 programs and the lb4 maps) or v1.IPv6Protocol (the
	// programs ending in 6 and the lb6 maps). The IPv6 programs also
	// translate IPv4-mapped addresses (::ffff:a.b.c.d) of dual-stack
	// sockets, with the lb4 maps: they take over those the IPv4 Datapath
	// of the same PinPath and NamePrefix pinned, or pin new ones for it to
	// take over, so open both families with the same Sizes.
	Family v1.IPFamily
	// CgroupPath is the cgroup v2 directory the programs are attached
	// to; they act on the sockets of every process in it and in the
	// cgroups below it. Required: the writer never guesses which
	// cgroup holds the node's workloads (the root of the unified
	// hierarchy on a usual node).
	CgroupPath string
	// PinPath is a directory on a bpffs where the maps and the links
	// that attach the programs are pinned, so that they outlive the
	// process and the next one takes them over; "" means DefaultPinPath.
	PinPath string
	// NamePrefix starts the name of each pinned object
	// (PREFIX_lb4_services, PREFIX_lb_connect4, ...), so that two
	// proxies on one node pin apart; "" means DefaultNamePrefix. Letters,
	// digits, '-' and '_', at most 32.
	NamePrefix string
	// Sizes are the capacities of the maps; zero fields take
	// DefaultSizes'. Pinned maps of another size are refused: Cleanup
	// first to resize.
	Sizes Sizes
}

// pinNames are the pinned names of one family's objects.
type pinNames struct {
	maps  map[string]string // ELF map name → pin path
	links map[string]string // ELF program name → pin path
	// borrowed are the other family's maps that this family's programs
	// read too: the IPv4 maps, for IPv4-mapped addresses on IPv6 sockets.
	borrowed map[string]string
}

// borrowedMaps returns the ELF names of the maps family's programs use
// beside their own: the IPv6 programs translate IPv4-mapped addresses
// with the IPv4 maps, which the IPv4 Datapath owns and the IPv4 writer
// fills.
func borrowedMaps(f v1.IPFamily) []string {
	if f != v1.IPv6Protocol {
		return nil
	}
	own, _ := objectNames(v1.IPv4Protocol)
	return own
}

func (c DatapathConfig) validate() (DatapathConfig, error) {
	if c.Family != v1.IPv4Protocol && c.Family != v1.IPv6Protocol {
		return c, fmt.Errorf("ebpf: datapath family %s is not IPv4 or IPv6", logsafe.Quote(string(c.Family)))
	}
	if c.PinPath == "" {
		c.PinPath = DefaultPinPath
	}
	if c.NamePrefix == "" {
		c.NamePrefix = DefaultNamePrefix
	}
	if !validPrefix(c.NamePrefix) {
		return c, fmt.Errorf("ebpf: name prefix %s: want letters, digits, '-' and '_', at most 32", logsafe.Quote(c.NamePrefix))
	}
	c.Sizes = c.Sizes.withDefaults()
	return c, c.Sizes.validate()
}

func validPrefix(s string) bool {
	if len(s) > 32 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return true
}

// familyTag is "4" or "6", the suffix of the family's programs and the
// digit of its maps' names.
func familyTag(f v1.IPFamily) string {
	if f == v1.IPv6Protocol {
		return "6"
	}
	return "4"
}

// objectNames returns the ELF names of the family's maps and programs.
func objectNames(f v1.IPFamily) (mapNames, progNames []string) {
	t := familyTag(f)
	for _, m := range []string{"services", "slots", "endpoints", "affinity", "revnat"} {
		mapNames = append(mapNames, "lb"+t+"_"+m)
	}
	for _, p := range []string{"connect", "sendmsg", "recvmsg", "getpeername"} {
		progNames = append(progNames, "lb_"+p+t)
	}
	return mapNames, progNames
}

func (c DatapathConfig) pins() pinNames {
	mapNames, progNames := objectNames(c.Family)
	p := pinNames{maps: map[string]string{}, links: map[string]string{}, borrowed: map[string]string{}}
	for _, m := range mapNames {
		p.maps[m] = filepath.Join(c.PinPath, c.NamePrefix+"_"+m)
	}
	for _, m := range borrowedMaps(c.Family) {
		p.borrowed[m] = filepath.Join(c.PinPath, c.NamePrefix+"_"+m)
	}
	for _, prog := range progNames {
		p.links[prog] = filepath.Join(c.PinPath, c.NamePrefix+"_"+prog)
	}
	return p
}
