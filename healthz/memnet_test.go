package healthz

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sync"
	"syscall"
)

// memNet is an in-memory network for unit tests: Listen registers a
// listener under its address, and the client from Client connects to it
// through net.Pipe. It records every open and close, so tests can tell a
// listener that kept serving from one that was closed and reopened.
type memNet struct {
	mu        sync.Mutex
	listeners map[string]*memListener
	fail      map[string]error
	log       []string
	serial    int
}

func newMemNet() *memNet {
	return &memNet{listeners: map[string]*memListener{}, fail: map[string]error{}}
}

// Listen is a ListenFunc.
func (n *memNet) Listen(_ context.Context, network, address string) (net.Listener, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if network != "tcp" {
		return nil, fmt.Errorf("memNet: network %q", network)
	}
	if err := n.fail[address]; err != nil {
		return nil, &net.OpError{Op: "listen", Net: network, Err: err}
	}
	if n.listeners[address] != nil {
		return nil, &net.OpError{Op: "listen", Net: network, Err: syscall.EADDRINUSE}
	}
	n.serial++
	l := &memListener{net: n, addr: address, id: n.serial, conns: make(chan net.Conn), closed: make(chan struct{})}
	n.listeners[address] = l
	n.log = append(n.log, fmt.Sprintf("open %s #%d", address, l.id))
	return l, nil
}

// open returns the addresses listened on now, with the serial number of
// their listener.
func (n *memNet) open() map[string]int {
	n.mu.Lock()
	defer n.mu.Unlock()
	m := map[string]int{}
	for a, l := range n.listeners {
		m[a] = l.id
	}
	return m
}

func (n *memNet) dial(ctx context.Context, _, address string) (net.Conn, error) {
	n.mu.Lock()
	l := n.listeners[address]
	n.mu.Unlock()
	if l == nil {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	}
	client, server := net.Pipe()
	select {
	case l.conns <- server:
		return client, nil
	case <-l.closed:
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Client returns an HTTP client whose connections go to memNet listeners.
func (n *memNet) Client() *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: n.dial, DisableKeepAlives: true}}
}

type memListener struct {
	net    *memNet
	addr   string
	id     int
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func (l *memListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *memListener) Close() error {
	l.once.Do(func() {
		close(l.closed)
		l.net.mu.Lock()
		defer l.net.mu.Unlock()
		if l.net.listeners[l.addr] == l {
			delete(l.net.listeners, l.addr)
		}
		l.net.log = append(l.net.log, fmt.Sprintf("close %s #%d", l.addr, l.id))
	})
	return nil
}

func (l *memListener) Addr() net.Addr { return memAddr(l.addr) }

type memAddr string

func (a memAddr) Network() string { return "tcp" }
func (a memAddr) String() string  { return string(a) }
