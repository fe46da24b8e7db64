package main

import (
	"encoding/json"
	"fmt"
	"net/http"
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

// configzGroup is the key of kube-proxy's configuration on /configz.
const configzGroup = "kubeproxy.config.k8s.io"

// configzHandler serves /configz as kube-proxy's metrics server does: a
// JSON object holding the effective configuration under its API group.
// The configuration is read once; it does not change while the proxier
// runs.
func configzHandler(cfg *kubeproxyconfig.KubeProxyConfiguration) (http.Handler, error) {
	body, err := json.Marshal(map[string]any{configzGroup: cfg})
	if err != nil {
		return nil, fmt.Errorf("/configz: %w", err)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	}), nil
}
