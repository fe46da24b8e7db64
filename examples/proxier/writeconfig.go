package main

import (
	"fmt"
	"os"

	logsapi "k8s.io/component-base/logs/api/v1"
	kubeproxyconfig "k8s.io/kube-proxy/config/v1alpha1"
	"sigs.k8s.io/yaml"
)

// effectiveConfig is the KubeProxyConfiguration (v1alpha1) that o runs
// with, whether it came from flags or a file: read back with --config, it
// gives the same options (see kubeproxy.Config.Configuration for the two
// values that read back as defaults). The settings kubeproxy has no field
// for are added here: the node name, the client connection and -v.
func effectiveConfig(o *options) *kubeproxyconfig.KubeProxyConfiguration {
	cfg := o.kubeProxyConfig().Configuration()
	cfg.HostnameOverride = o.hostnameOverride
	cfg.Logging.Verbosity = logsapi.VerbosityLevel(o.verbosity)
	cc := &cfg.ClientConnection
	cc.Kubeconfig, cc.QPS, cc.Burst = o.kubeconfig, o.client.QPS, int32(o.client.Burst)
	cc.ContentType, cc.AcceptContentTypes = o.client.ContentType, o.client.AcceptContentTypes
	return cfg
}

// writeConfigFile is --write-config-to: it writes effectiveConfig(o) as
// YAML to o.writeConfigTo, as kube-proxy writes its configuration there.
func writeConfigFile(o *options) error {
	data, err := yaml.Marshal(effectiveConfig(o))
	if err != nil {
		return fmt.Errorf("--write-config-to: %w", err)
	}
	if err := os.WriteFile(o.writeConfigTo, data, 0o644); err != nil {
		return fmt.Errorf("--write-config-to: %w", err)
	}
	return nil
}
