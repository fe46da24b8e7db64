package ebpf

// The BPF programs (bpf/sock.c, maps in bpf/lb.h) are compiled by bpf2go
// into lb_bpfel.o and lb_bpfeb.o and the Go files that load them, all
// committed, so that users of the package need no clang; `make
// ebpf-check` regenerates them and fails on a difference. The include
// path is Debian's for the multiarch asm/ headers of linux-libc-dev.
//go:generate go tool bpf2go -cc clang -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target bpfel,bpfeb lb bpf/sock.c
