package main

import (
	"fmt"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// apiServerConfig returns the client configuration of the API server the
// proxier watches: from --kubeconfig and --master when either is given
// (the file's clientConnection.kubeconfig counts as --kubeconfig), else
// the in-cluster configuration of the pod the proxier runs in, which
// inCluster (rest.InClusterConfig outside tests) reads from the service
// account's token and the KUBERNETES_SERVICE_HOST/PORT variables. With
// neither, outside a pod, it fails saying what to give, rather than
// falling back to client-go's localhost default as clientcmd does. The
// configuration file's qps, burst and content types are applied.
func apiServerConfig(o *options, inCluster func() (*rest.Config, error)) (*rest.Config, error) {
	var cfg *rest.Config
	if o.kubeconfig == "" && o.master == "" {
		c, err := inCluster()
		if err != nil {
			return nil, fmt.Errorf("no API server: give --kubeconfig or --master (or clientConnection.kubeconfig in --config), run the proxier in a pod for the in-cluster configuration, or use --manifests: %w", err)
		}
		cfg = c
	} else {
		c, err := clientcmd.BuildConfigFromFlags(o.master, o.kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("API server configuration: %w", err)
		}
		cfg = c
	}
	cfg.UserAgent = "proxykit-proxier"
	if o.client.QPS > 0 {
		cfg.QPS = o.client.QPS
	}
	if o.client.Burst > 0 {
		cfg.Burst = o.client.Burst
	}
	if o.client.ContentType != "" {
		cfg.ContentType = o.client.ContentType
	}
	if o.client.AcceptContentTypes != "" {
		cfg.AcceptContentTypes = o.client.AcceptContentTypes
	}
	return cfg, nil
}
