// Package ebpftest is an in-memory fake of the socket load balancer's maps
// (an ebpf.Maps, sized like the kernel's and full where they would be) and
// a connect-time tracer that says which endpoints a socket connecting to a
// frontend reaches, with their probabilities, as the BPF programs would
// choose them from the same maps.
package ebpftest
