package ebpf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"sync"
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

	// mu guards the writers and buf.
	mu                     sync.Mutex
	svcW, slotW, endpointW mapWriter
	buf                    kernelBufs
}

// kernelBufs hold one chunk of elements in the maps' layout, reused from
// write to write.
type kernelBufs struct {
	k4    []lbLb4Key
	k6    []lbLb6Key
	svcs  []lbLbService
	slots []lbLbSlotKey
	ep4   []lbLb4Endpoint
	ep6   []lbLb6Endpoint
}

// batchChunk bounds the elements of one batch, and so the buffers a
// Datapath keeps and the time one syscall holds the CPU.
const batchChunk = 4096

// kernelMap is what the writes use of a map: an *ebpf.Map, or a test's
// wrapper of one.
type kernelMap interface {
	BatchUpdate(keys, values any, opts *ebpf.BatchOptions) (int, error)
	BatchDelete(keys any, opts *ebpf.BatchOptions) (int, error)
	Update(key, value any, flags ebpf.MapUpdateFlags) error
	Delete(key any) error
}

// mapWriter writes one of the kernel's maps, in batches
// (BPF_MAP_UPDATE_BATCH, BPF_MAP_DELETE_BATCH) while the kernel takes
// them, one element a syscall once it has refused one (a kernel before
// 5.6, or a map type without batches).
type mapWriter struct {
	m          kernelMap
	name       string
	size       int
	perElement bool
}

// update writes keys[i] → values[i] and returns how many it wrote before
// an error.
func update[K, V any](w *mapWriter, keys []K, values []V) (int, error) {
	if !w.perElement {
		n, err := w.m.BatchUpdate(keys, values, nil)
		switch {
		case err == nil:
			return len(keys), nil
		case !errors.Is(err, ebpf.ErrNotSupported):
			if n < 0 || n >= len(keys) {
				// The kernel failed before the elements: it left
				// the count as given.
				n = 0
			}
			return n, w.err(err)
		}
		// A refused batch's count says nothing; whatever it wrote is
		// written again, which changes nothing.
		w.perElement = true
	}
	for i := range keys {
		if err := w.m.Update(&keys[i], &values[i], ebpf.UpdateAny); err != nil {
			return i, w.err(err)
		}
	}
	return len(keys), nil
}

// remove deletes keys and returns how many it deleted before an error. A
// missing key counts as deleted.
func remove[K any](w *mapWriter, keys []K) (int, error) {
	done := 0
	for !w.perElement && done < len(keys) {
		n, err := w.m.BatchDelete(keys[done:], nil)
		switch {
		case err == nil:
			return len(keys), nil
		case errors.Is(err, ebpf.ErrNotSupported):
			w.perElement = true
		case n < 0 || n >= len(keys)-done:
			return done, err
		case errors.Is(err, ebpf.ErrKeyNotExist):
			// A batch stops at a missing key: go on after it.
			done += n + 1
		default:
			return done + n, err
		}
	}
	for ; done < len(keys); done++ {
		if err := w.m.Delete(&keys[done]); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return done, err
		}
	}
	return len(keys), nil
}

func (w *mapWriter) err(err error) error {
	if errors.Is(err, syscall.E2BIG) {
		return mapFull(w.name, w.size)
	}
	return err
}

// chunked calls write for the elements lo to hi of n, batchChunk at a
// time, and returns how many it wrote before an error.
func chunked(n int, write func(lo, hi int) (int, error)) (int, error) {
	done := 0
	for done < n {
		k, err := write(done, min(n, done+batchChunk))
		done += k
		if err != nil {
			return done, err
		}
	}
	return done, nil
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
	d.svcW = mapWriter{m: d.services, name: "services", size: cfg.Sizes.Services}
	d.slotW = mapWriter{m: d.slots, name: "slots", size: cfg.Sizes.Endpoints}
	d.endpointW = mapWriter{m: d.endpoints, name: "endpoints", size: cfg.Sizes.Endpoints}
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

// UpdateServices is part of Maps.
func (d *Datapath) UpdateServices(keys []Frontend, values []Service) (int, error) {
	if len(keys) != len(values) {
		return 0, fmt.Errorf("ebpf: %d frontends and %d services", len(keys), len(values))
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return chunked(len(keys), func(lo, hi int) (int, error) {
		svcs := d.buf.svcs[:0]
		for _, s := range values[lo:hi] {
			svcs = append(svcs, lbLbService{Id: s.ID, Count: s.Count, AffinitySeconds: s.AffinitySeconds, Flags: uint16(s.Flags)})
		}
		d.buf.svcs = svcs
		if d.cfg.Family == v1.IPv4Protocol {
			d.buf.k4 = appendKeys4(d.buf.k4[:0], keys[lo:hi])
			return update(&d.svcW, d.buf.k4, svcs)
		}
		d.buf.k6 = appendKeys6(d.buf.k6[:0], keys[lo:hi])
		return update(&d.svcW, d.buf.k6, svcs)
	})
}

// DeleteServices is part of Maps.
func (d *Datapath) DeleteServices(keys []Frontend) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return chunked(len(keys), func(lo, hi int) (int, error) {
		if d.cfg.Family == v1.IPv4Protocol {
			d.buf.k4 = appendKeys4(d.buf.k4[:0], keys[lo:hi])
			return remove(&d.svcW, d.buf.k4)
		}
		d.buf.k6 = appendKeys6(d.buf.k6[:0], keys[lo:hi])
		return remove(&d.svcW, d.buf.k6)
	})
}

// UpdateSlots is part of Maps.
func (d *Datapath) UpdateSlots(keys []SlotKey, ids []uint32) (int, error) {
	if len(keys) != len(ids) {
		return 0, fmt.Errorf("ebpf: %d slots and %d endpoint ids", len(keys), len(ids))
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return chunked(len(keys), func(lo, hi int) (int, error) {
		d.buf.slots = appendSlotKeys(d.buf.slots[:0], keys[lo:hi])
		return update(&d.slotW, d.buf.slots, ids[lo:hi])
	})
}

// DeleteSlots is part of Maps.
func (d *Datapath) DeleteSlots(keys []SlotKey) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return chunked(len(keys), func(lo, hi int) (int, error) {
		d.buf.slots = appendSlotKeys(d.buf.slots[:0], keys[lo:hi])
		return remove(&d.slotW, d.buf.slots)
	})
}

// UpdateEndpoints is part of Maps.
func (d *Datapath) UpdateEndpoints(ids []uint32, values []Endpoint) (int, error) {
	if len(ids) != len(values) {
		return 0, fmt.Errorf("ebpf: %d endpoint ids and %d endpoints", len(ids), len(values))
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return chunked(len(ids), func(lo, hi int) (int, error) {
		if d.cfg.Family == v1.IPv4Protocol {
			eps := d.buf.ep4[:0]
			for _, ep := range values[lo:hi] {
				eps = append(eps, lbLb4Endpoint{Service: ep.Service, Addr: addr4(ep.Addr), Port: port(ep.Port)})
			}
			d.buf.ep4 = eps
			return update(&d.endpointW, ids[lo:hi], eps)
		}
		eps := d.buf.ep6[:0]
		for _, ep := range values[lo:hi] {
			eps = append(eps, lbLb6Endpoint{Service: ep.Service, Addr: addr6(ep.Addr), Port: port(ep.Port)})
		}
		d.buf.ep6 = eps
		return update(&d.endpointW, ids[lo:hi], eps)
	})
}

// DeleteEndpoints is part of Maps.
func (d *Datapath) DeleteEndpoints(ids []uint32) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return chunked(len(ids), func(lo, hi int) (int, error) {
		return remove(&d.endpointW, ids[lo:hi])
	})
}

// UpdateService writes one element, as UpdateServices does.
func (d *Datapath) UpdateService(f Frontend, s Service) error {
	_, err := d.UpdateServices([]Frontend{f}, []Service{s})
	return err
}

// DeleteService deletes one element, as DeleteServices does.
func (d *Datapath) DeleteService(f Frontend) error {
	_, err := d.DeleteServices([]Frontend{f})
	return err
}

// UpdateSlot writes one element, as UpdateSlots does.
func (d *Datapath) UpdateSlot(k SlotKey, id uint32) error {
	_, err := d.UpdateSlots([]SlotKey{k}, []uint32{id})
	return err
}

// DeleteSlot deletes one element, as DeleteSlots does.
func (d *Datapath) DeleteSlot(k SlotKey) error {
	_, err := d.DeleteSlots([]SlotKey{k})
	return err
}

// UpdateEndpoint writes one element, as UpdateEndpoints does.
func (d *Datapath) UpdateEndpoint(id uint32, ep Endpoint) error {
	_, err := d.UpdateEndpoints([]uint32{id}, []Endpoint{ep})
	return err
}

// DeleteEndpoint deletes one element, as DeleteEndpoints does.
func (d *Datapath) DeleteEndpoint(id uint32) error {
	_, err := d.DeleteEndpoints([]uint32{id})
	return err
}

func appendKeys4(dst []lbLb4Key, fs []Frontend) []lbLb4Key {
	for _, f := range fs {
		proto, _ := ProtocolNumber(f.Protocol)
		dst = append(dst, lbLb4Key{Addr: addr4(f.Addr), Port: port(f.Port), Proto: proto})
	}
	return dst
}

func appendKeys6(dst []lbLb6Key, fs []Frontend) []lbLb6Key {
	for _, f := range fs {
		proto, _ := ProtocolNumber(f.Protocol)
		dst = append(dst, lbLb6Key{Addr: addr6(f.Addr), Port: port(f.Port), Proto: proto})
	}
	return dst
}

func appendSlotKeys(dst []lbLbSlotKey, ks []SlotKey) []lbLbSlotKey {
	for _, k := range ks {
		dst = append(dst, lbLbSlotKey{Service: k.Service, Slot: k.Slot})
	}
	return dst
}

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
