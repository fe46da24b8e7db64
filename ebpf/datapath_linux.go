package ebpf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"syscall"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	v1 "k8s.io/api/core/v1"
)

// Datapath is one family's programs, loaded and attached to a cgroup, and
// its maps, pinned on a bpffs. It is the kernel's Maps.
type Datapath struct {
	cfg       DatapathConfig
	coll      *ebpf.Collection
	services  *ebpf.Map
	slots     *ebpf.Map
	endpoints *ebpf.Map
	links     []link.Link
}

var _ Maps = (*Datapath)(nil)

// attachTypes are the hooks of the programs, by ELF name.
var attachTypes = map[string]ebpf.AttachType{
	"lb_connect4":     ebpf.AttachCGroupInet4Connect,
	"lb_sendmsg4":     ebpf.AttachCGroupUDP4Sendmsg,
	"lb_recvmsg4":     ebpf.AttachCGroupUDP4Recvmsg,
	"lb_getpeername4": ebpf.AttachCgroupInet4GetPeername,
	"lb_connect6":     ebpf.AttachCGroupInet6Connect,
	"lb_sendmsg6":     ebpf.AttachCGroupUDP6Sendmsg,
	"lb_recvmsg6":     ebpf.AttachCGroupUDP6Recvmsg,
	"lb_getpeername6": ebpf.AttachCgroupInet6GetPeername,
}

// Open loads cfg.Family's programs and attaches them to cfg.CgroupPath,
// pinning the maps and the links under cfg.PinPath. Maps already pinned
// there under the same names are taken over with their content (a
// restarted proxy keeps serving while it syncs), and so are links, whose
// program is replaced in place; a pinned map of another layout or size is
// an error. It fails when the kernel refuses a program (the verifier's
// log is in the error) or the cgroup is not a cgroup v2 directory. Close
// releases the process's hold and leaves everything attached; Cleanup
// removes it.
func Open(cfg DatapathConfig) (*Datapath, error) {
	cfg, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	if cfg.CgroupPath == "" {
		return nil, errors.New("ebpf: DatapathConfig.CgroupPath is required")
	}
	spec, err := loadLb()
	if err != nil {
		return nil, err
	}
	own, progNames := objectNames(cfg.Family)
	mapNames := append(own, borrowedMaps(cfg.Family)...)
	keepOnly(spec, mapNames, progNames)
	sizes := map[string]int{}
	for _, m := range mapNames {
		sizes[m] = mapSize(cfg.Sizes, m)
		spec.Maps[m].MaxEntries = uint32(sizes[m])
	}
	if err := os.MkdirAll(cfg.PinPath, 0o700); err != nil {
		return nil, fmt.Errorf("ebpf: pin directory: %w", err)
	}
	pins := cfg.pins()
	maps.Copy(pins.maps, pins.borrowed)
	replace := map[string]*ebpf.Map{}
	defer func() {
		for _, m := range replace {
			m.Close()
		}
	}()
	for _, name := range mapNames {
		m, err := ebpf.LoadPinnedMap(pins.maps[name], nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("ebpf: pinned map %s: %w", pins.maps[name], err)
		}
		replace[name] = m
		if err := spec.Maps[name].Compatible(m); err != nil {
			return nil, fmt.Errorf("ebpf: pinned map %s differs from this version's or this size (Cleanup removes it): %w", pins.maps[name], err)
		}
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{MapReplacements: replace})
	if err != nil {
		return nil, fmt.Errorf("ebpf: loading the %s programs: %w", cfg.Family, err)
	}
	d := &Datapath{cfg: cfg, coll: coll}
	fail := func(err error) (*Datapath, error) {
		d.Close()
		return nil, err
	}
	for _, name := range mapNames {
		if _, ok := replace[name]; ok {
			continue
		}
		if err := coll.Maps[name].Pin(pins.maps[name]); err != nil {
			return fail(fmt.Errorf("ebpf: pinning map %s: %w", name, err))
		}
	}
	t := familyTag(cfg.Family)
	d.services, d.slots, d.endpoints = coll.Maps["lb"+t+"_services"], coll.Maps["lb"+t+"_slots"], coll.Maps["lb"+t+"_endpoints"]
	cgroupID, err := cgroupID(cfg.CgroupPath)
	if err != nil {
		return fail(err)
	}
	for _, name := range progNames {
		l, err := attach(cfg.CgroupPath, cgroupID, pins.links[name], coll.Programs[name], attachTypes[name])
		if err != nil {
			return fail(fmt.Errorf("ebpf: attaching %s to %s: %w", name, cfg.CgroupPath, err))
		}
		d.links = append(d.links, l)
	}
	return d, nil
}

// attach takes over the link pinned at pin when it attaches to the same
// cgroup, replacing its program, and attaches and pins a new link
// otherwise.
func attach(cgroup string, cgroupID uint64, pin string, prog *ebpf.Program, at ebpf.AttachType) (link.Link, error) {
	if l, err := link.LoadPinnedLink(pin, nil); err == nil {
		if info, err := l.Info(); err == nil && info.Cgroup() != nil && info.Cgroup().CgroupId == cgroupID {
			if err := l.Update(prog); err != nil {
				l.Close()
				return nil, err
			}
			return l, nil
		}
		// Pinned for another cgroup, or broken: replace it.
		_ = l.Unpin()
		_ = l.Close()
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	l, err := link.AttachCgroup(link.CgroupOptions{Path: cgroup, Attach: at, Program: prog})
	if err != nil {
		return nil, err
	}
	if err := l.Pin(pin); err != nil {
		_ = l.Close()
		return nil, fmt.Errorf("pinning the link: %w", err)
	}
	return l, nil
}

// cgroupID returns the id of the cgroup v2 directory path, which is its
// inode number.
func cgroupID(path string) (uint64, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return 0, fmt.Errorf("ebpf: cgroup: %w", err)
	}
	var fs syscall.Statfs_t
	if err := syscall.Statfs(path, &fs); err != nil {
		return 0, fmt.Errorf("ebpf: cgroup: %w", err)
	}
	const cgroup2Magic = 0x63677270
	if fs.Type != cgroup2Magic {
		return 0, fmt.Errorf("ebpf: %s is not on a cgroup v2 file system", path)
	}
	return st.Ino, nil
}

// keepOnly removes from spec every map and program not named.
func keepOnly(spec *ebpf.CollectionSpec, mapNames, progNames []string) {
	keep := map[string]bool{}
	for _, n := range append(append([]string{}, mapNames...), progNames...) {
		keep[n] = true
	}
	for n := range spec.Maps {
		if !keep[n] {
			delete(spec.Maps, n)
		}
	}
	for n := range spec.Programs {
		if !keep[n] {
			delete(spec.Programs, n)
		}
	}
}

// mapSize returns the size Sizes gives the map named name.
func mapSize(s Sizes, name string) int {
	switch name[4:] {
	case "services":
		return s.Services
	case "slots", "endpoints":
		return s.Endpoints
	case "affinity":
		return s.Affinity
	}
	return s.RevNAT
}

// Close releases the datapath's file descriptors. What it attached and
// pinned stays, so the programs keep serving from the maps' last content
// (the next Open takes them over); Cleanup removes them.
func (d *Datapath) Close() error {
	var errs []error
	for _, l := range d.links {
		errs = append(errs, l.Close())
	}
	d.links = nil
	if d.coll != nil {
		d.coll.Close()
	}
	return errors.Join(errs...)
}

// Family is part of Maps.
func (d *Datapath) Family() v1.IPFamily { return d.cfg.Family }

// Sizes is part of Maps.
func (d *Datapath) Sizes() Sizes { return d.cfg.Sizes }

// UpdateService is part of Maps.
func (d *Datapath) UpdateService(f Frontend, s Service) error {
	v := lbLbService{Id: s.ID, Count: s.Count, AffinitySeconds: s.AffinitySeconds, Flags: uint16(s.Flags)}
	return d.update(d.services, "services", d.cfg.Sizes.Services, d.frontendKey(f), &v)
}

// DeleteService is part of Maps.
func (d *Datapath) DeleteService(f Frontend) error {
	return deleteElem(d.services, d.frontendKey(f))
}

// UpdateSlot is part of Maps.
func (d *Datapath) UpdateSlot(k SlotKey, id uint32) error {
	return d.update(d.slots, "slots", d.cfg.Sizes.Endpoints, &lbLbSlotKey{Service: k.Service, Slot: k.Slot}, &id)
}

// DeleteSlot is part of Maps.
func (d *Datapath) DeleteSlot(k SlotKey) error {
	return deleteElem(d.slots, &lbLbSlotKey{Service: k.Service, Slot: k.Slot})
}

// UpdateEndpoint is part of Maps.
func (d *Datapath) UpdateEndpoint(id uint32, ep Endpoint) error {
	var v any
	if d.cfg.Family == v1.IPv4Protocol {
		v = &lbLb4Endpoint{Service: ep.Service, Addr: addr4(ep.Addr), Port: port(ep.Port)}
	} else {
		v = &lbLb6Endpoint{Service: ep.Service, Addr: addr6(ep.Addr), Port: port(ep.Port)}
	}
	return d.update(d.endpoints, "endpoints", d.cfg.Sizes.Endpoints, &id, v)
}

// DeleteEndpoint is part of Maps.
func (d *Datapath) DeleteEndpoint(id uint32) error { return deleteElem(d.endpoints, &id) }

// Dump is part of Maps.
func (d *Datapath) Dump() (*State, error) {
	s := NewState()
	var sv lbLbService
	if d.cfg.Family == v1.IPv4Protocol {
		var k lbLb4Key
		it := d.services.Iterate()
		for it.Next(&k, &sv) {
			s.Services[frontendOf(addrOf4(k.Addr), k.Port, k.Proto)] = serviceOf(sv)
		}
		if err := it.Err(); err != nil {
			return nil, err
		}
		var id uint32
		var ep lbLb4Endpoint
		it = d.endpoints.Iterate()
		for it.Next(&id, &ep) {
			s.Endpoints[id] = Endpoint{Service: ep.Service, Addr: addrOf4(ep.Addr), Port: unport(ep.Port)}
		}
		if err := it.Err(); err != nil {
			return nil, err
		}
	} else {
		var k lbLb6Key
		it := d.services.Iterate()
		for it.Next(&k, &sv) {
			s.Services[frontendOf(addrOf6(k.Addr), k.Port, k.Proto)] = serviceOf(sv)
		}
		if err := it.Err(); err != nil {
			return nil, err
		}
		var id uint32
		var ep lbLb6Endpoint
		it = d.endpoints.Iterate()
		for it.Next(&id, &ep) {
			s.Endpoints[id] = Endpoint{Service: ep.Service, Addr: addrOf6(ep.Addr), Port: unport(ep.Port)}
		}
		if err := it.Err(); err != nil {
			return nil, err
		}
	}
	var sk lbLbSlotKey
	var id uint32
	it := d.slots.Iterate()
	for it.Next(&sk, &id) {
		s.Slots[SlotKey{Service: sk.Service, Slot: sk.Slot}] = id
	}
	return s, it.Err()
}

func (d *Datapath) update(m *ebpf.Map, name string, size int, k, v any) error {
	err := m.Update(k, v, ebpf.UpdateAny)
	if errors.Is(err, syscall.E2BIG) {
		return mapFull(name, size)
	}
	return err
}

func deleteElem(m *ebpf.Map, k any) error {
	if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return err
	}
	return nil
}

func (d *Datapath) frontendKey(f Frontend) any {
	proto, _ := ProtocolNumber(f.Protocol)
	if d.cfg.Family == v1.IPv4Protocol {
		return &lbLb4Key{Addr: addr4(f.Addr), Port: port(f.Port), Proto: proto}
	}
	return &lbLb6Key{Addr: addr6(f.Addr), Port: port(f.Port), Proto: proto}
}

func frontendOf(a netip.Addr, p uint16, proto uint8) Frontend {
	f := Frontend{Addr: a, Port: unport(p)}
	for _, pr := range []v1.Protocol{v1.ProtocolTCP, v1.ProtocolUDP, v1.ProtocolSCTP} {
		if n, _ := ProtocolNumber(pr); n == proto {
			f.Protocol = pr
		}
	}
	return f
}

func serviceOf(v lbLbService) Service {
	return Service{ID: v.Id, Count: v.Count, AffinitySeconds: v.AffinitySeconds, Flags: Flags(v.Flags)}
}

// The maps hold addresses and ports in network byte order: the bytes of
// the Go field in memory are the bytes on the wire, whatever the host's
// byte order.
func addr4(a netip.Addr) uint32 {
	b := a.As4()
	return binary.NativeEndian.Uint32(b[:])
}

func addrOf4(v uint32) netip.Addr {
	var b [4]byte
	binary.NativeEndian.PutUint32(b[:], v)
	return netip.AddrFrom4(b)
}

func addr6(a netip.Addr) (w [4]uint32) {
	b := a.As16()
	for i := range w {
		w[i] = binary.NativeEndian.Uint32(b[4*i:])
	}
	return w
}

func addrOf6(w [4]uint32) netip.Addr {
	var b [16]byte
	for i := range w {
		binary.NativeEndian.PutUint32(b[4*i:], w[i])
	}
	return netip.AddrFrom16(b)
}

func port(p uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], p)
	return binary.NativeEndian.Uint16(b[:])
}

func unport(p uint16) uint16 {
	var b [2]byte
	binary.NativeEndian.PutUint16(b[:], p)
	return binary.BigEndian.Uint16(b[:])
}

// Cleanup detaches the programs and removes the maps cfg.Family's
// Datapath pinned under cfg.PinPath with cfg.NamePrefix; a Family of ""
// cleans both families. The IPv4 maps an IPv6 Datapath pinned for its
// IPv4-mapped addresses go with the IPv6 cleanup only when no IPv4
// program is pinned (an IPv4 Datapath owns them otherwise). What is not
// there is skipped; it returns the errors of what it could not remove. A
// program stays attached while another process holds its link open (a
// running proxy): stop it first.
func Cleanup(cfg DatapathConfig) error {
	fams := []DatapathConfig{cfg}
	if cfg.Family == "" {
		c4, c6 := cfg, cfg
		c4.Family, c6.Family = v1.IPv4Protocol, v1.IPv6Protocol
		fams = []DatapathConfig{c4, c6}
	}
	var errs []error
	for _, c := range fams {
		c, err := c.validate()
		if err != nil {
			return err
		}
		pins := c.pins()
		for _, pin := range pins.links {
			l, err := link.LoadPinnedLink(pin, nil)
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("ebpf: pinned link %s: %w", pin, err))
				continue
			}
			if err := l.Detach(); err != nil {
				errs = append(errs, fmt.Errorf("ebpf: detaching %s: %w", pin, err))
			}
			if err := l.Unpin(); err != nil {
				errs = append(errs, fmt.Errorf("ebpf: unpinning %s: %w", pin, err))
			}
			l.Close()
		}
		if len(pins.borrowed) > 0 && !linksPinned(c, v1.IPv4Protocol) {
			maps.Copy(pins.maps, pins.borrowed)
		}
		for _, pin := range pins.maps {
			if err := os.Remove(pin); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, fmt.Errorf("ebpf: removing %s: %w", pin, err))
			}
		}
	}
	return errors.Join(errs...)
}

// linksPinned reports whether any program of family is pinned for c.
func linksPinned(c DatapathConfig, family v1.IPFamily) bool {
	c.Family = family
	for _, pin := range c.pins().links {
		if _, err := os.Lstat(pin); err == nil {
			return true
		}
	}
	return false
}

// FindLeftovers reports whether anything that Cleanup(cfg) would remove is
// pinned.
func FindLeftovers(cfg DatapathConfig) (bool, error) {
	fams := []v1.IPFamily{cfg.Family}
	if cfg.Family == "" {
		fams = []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}
	}
	for _, f := range fams {
		c := cfg
		c.Family = f
		c, err := c.validate()
		if err != nil {
			return false, err
		}
		pins := c.pins()
		for _, set := range []map[string]string{pins.maps, pins.links} {
			for _, pin := range set {
				if _, err := os.Lstat(pin); err == nil {
					return true, nil
				} else if !errors.Is(err, os.ErrNotExist) {
					return false, err
				}
			}
		}
	}
	return false, nil
}
