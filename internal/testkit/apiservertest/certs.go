package apiservertest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"time"
)

// keyPair is a certificate and its private key, PEM-encoded.
type keyPair struct {
	cert, key []byte
	parsed    *x509.Certificate
	signer    *ecdsa.PrivateKey
}

// pki is the throwaway public key infrastructure of one cluster: a CA, the
// API servers' serving certificate, client certificates, and the key that
// signs service account tokens. Nothing of it outlives the test.
type pki struct {
	ca, serving, admin, kubeProxy keyPair
	// saKey and saPub are the service account signing key and its public
	// half, PEM-encoded.
	saKey, saPub []byte
}

// newPKI makes the certificates for API servers reachable on addrs (and on
// the loopback and the first address of the service range, as a cluster's
// own clients reach them).
func newPKI(addrs []netip.Addr, firstServiceIP netip.Addr) (*pki, error) {
	var p pki
	var err error
	if p.ca, err = newKeyPair(&x509.Certificate{
		Subject:               pkix.Name{CommonName: "proxykit-test-ca"},
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}, nil); err != nil {
		return nil, err
	}
	serving := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:    []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IP(firstServiceIP.AsSlice())},
	}
	for _, a := range addrs {
		serving.IPAddresses = append(serving.IPAddresses, net.IP(a.AsSlice()))
	}
	if p.serving, err = newKeyPair(serving, &p.ca); err != nil {
		return nil, err
	}
	// system:masters may do anything; system:kube-proxy is the user the
	// API server's default RBAC binds to kube-proxy's role
	// (system:node-proxier), so a proxier using it has exactly kube-proxy's
	// permissions.
	if p.admin, err = newClientPair("proxykit-test-admin", "system:masters", &p.ca); err != nil {
		return nil, err
	}
	if p.kubeProxy, err = newClientPair("system:kube-proxy", "", &p.ca); err != nil {
		return nil, err
	}
	sa, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("service account key: %w", err)
	}
	der, err := x509.MarshalECPrivateKey(sa)
	if err != nil {
		return nil, fmt.Errorf("service account key: %w", err)
	}
	p.saKey = pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
	pub, err := x509.MarshalPKIXPublicKey(&sa.PublicKey)
	if err != nil {
		return nil, fmt.Errorf("service account public key: %w", err)
	}
	p.saPub = pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub})
	return &p, nil
}

func newClientPair(user, group string, ca *keyPair) (keyPair, error) {
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: user},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if group != "" {
		tmpl.Subject.Organization = []string{group}
	}
	return newKeyPair(tmpl, ca)
}

// newKeyPair signs tmpl with parent, or by itself when parent is nil. The
// certificate is valid from an hour ago (clock skew between the test and
// nothing else, but cheap) for a day.
func newKeyPair(tmpl *x509.Certificate, parent *keyPair) (keyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return keyPair{}, fmt.Errorf("key for %s: %w", tmpl.Subject.CommonName, err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return keyPair{}, fmt.Errorf("serial for %s: %w", tmpl.Subject.CommonName, err)
	}
	tmpl.SerialNumber = serial
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.NotAfter = time.Now().Add(24 * time.Hour)
	issuer, signer := tmpl, key
	if parent != nil {
		issuer, signer = parent.parsed, parent.signer
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, issuer, &key.PublicKey, signer)
	if err != nil {
		return keyPair{}, fmt.Errorf("certificate for %s: %w", tmpl.Subject.CommonName, err)
	}
	parsed, err := x509.ParseCertificate(der)
	if err != nil {
		return keyPair{}, fmt.Errorf("certificate for %s: %w", tmpl.Subject.CommonName, err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return keyPair{}, fmt.Errorf("key for %s: %w", tmpl.Subject.CommonName, err)
	}
	return keyPair{
		cert:   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		key:    pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
		parsed: parsed,
		signer: key,
	}, nil
}

// write puts the files the API server reads into dir and returns their
// paths by role.
func (p *pki) write(dir string) (map[string]string, error) {
	files := map[string][]byte{
		"ca.crt":      p.ca.cert,
		"serving.crt": p.serving.cert,
		"serving.key": p.serving.key,
		"sa.key":      p.saKey,
		"sa.pub":      p.saPub,
	}
	paths := map[string]string{}
	for name, data := range files {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, data, 0o600); err != nil {
			return nil, err
		}
		paths[name] = path
	}
	return paths, nil
}
