package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/client-go/rest"
)

func TestAPIServerConfig(t *testing.T) {
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://192.0.2.1:6443"}
contexts:
- name: c
  context: {cluster: c, user: u}
current-context: c
users:
- name: u
  user: {token: t}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	inPod := func() (*rest.Config, error) { return &rest.Config{Host: "https://10.96.0.1:443"}, nil }
	notInPod := func() (*rest.Config, error) { return nil, rest.ErrNotInCluster }
	for _, tc := range []struct {
		name      string
		o         options
		inCluster func() (*rest.Config, error)
		wantHost  string
		wantErr   string
	}{
		{name: "in a pod", inCluster: inPod, wantHost: "https://10.96.0.1:443"},
		{name: "outside a pod", inCluster: notInPod, wantErr: "no API server: give --kubeconfig or --master"},
		{name: "kubeconfig", o: options{kubeconfig: kubeconfig}, inCluster: notInPod, wantHost: "https://192.0.2.1:6443"},
		{name: "master overrides the kubeconfig", o: options{kubeconfig: kubeconfig, master: "https://192.0.2.2:6443"}, inCluster: inPod, wantHost: "https://192.0.2.2:6443"},
		{name: "master alone", o: options{master: "https://192.0.2.3:6443"}, inCluster: inPod, wantHost: "https://192.0.2.3:6443"},
		{name: "missing kubeconfig", o: options{kubeconfig: kubeconfig + ".missing"}, inCluster: inPod, wantErr: "API server configuration"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := apiServerConfig(&tc.o, tc.inCluster)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %v, want an error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Host != tc.wantHost || cfg.UserAgent != "proxykit-proxier" {
				t.Errorf("host %q, user agent %q; want %q, proxykit-proxier", cfg.Host, cfg.UserAgent, tc.wantHost)
			}
		})
	}

	// The configuration file's client settings are applied.
	o := options{client: clientSettings{QPS: 50, Burst: 100, ContentType: "application/json", AcceptContentTypes: "application/json"}}
	cfg, err := apiServerConfig(&o, inPod)
	if err != nil {
		t.Fatal(err)
	}
	got := clientSettings{QPS: cfg.QPS, Burst: cfg.Burst, ContentType: cfg.ContentType, AcceptContentTypes: cfg.AcceptContentTypes}
	if diff := cmp.Diff(o.client, got); diff != "" {
		t.Errorf("client settings (-want +got):\n%s", diff)
	}

	// Outside a pod, client-go's own InClusterConfig refuses, and the
	// error says so.
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
	if _, err := apiServerConfig(&options{}, rest.InClusterConfig); !errors.Is(err, rest.ErrNotInCluster) {
		t.Errorf("outside a pod: got %v, want rest.ErrNotInCluster", err)
	}
}
