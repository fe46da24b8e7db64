// Package apiclients holds two clients of proxykit written as a peer project
// would write them, outside the module, against its public API only: a
// custom proxier Backend (backend) and a user of the iptables rule writer
// with the iptables fake (writer). `make api-check` builds and tests them,
// so a change to the public API that breaks them is seen; docs/api.md lists
// the renames that are allowed to change them.
package apiclients
