// Command etcd is etcd's own server command (etcdmain.Main), built from the
// go.etcd.io/etcd/server/v3 module at the version k8s.io/kubernetes
// requires, so that the API server tier runs the etcd its kube-apiserver
// was released with without a second download.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
