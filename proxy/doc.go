// Package proxy is the contract between a service proxy's composition (the
// proxier package, or a user's own) and a datapath: the [Backend] that
// turns one IP family's service and endpoint maps into kernel state, the
// [FamilyInput] it is handed, the [SyncResult] it reports, the [NodeConfig]
// every mode's renderer shares, and the defaults kube-proxy uses.
//
// It imports the change trackers' types and nothing else of proxykit, so a
// block can implement a Backend, and a renderer can take a FamilyInput,
// without compiling client-go's informers or the composition. It is what
// kube-proxy keeps in pkg/proxy, without the trackers, which live in
// package changetracker.
package proxy
