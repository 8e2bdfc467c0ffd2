package kube_test

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/config/generate"
	"github.com/siderolabs/talos/pkg/machinery/config/machine"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/homelab/bootstrap/lab/kube"
	"github.com/homelab/bootstrap/lab/kube/kubetest"
)

func parseCert(t *testing.T, pemBytes []byte) *x509.Certificate {
	t.Helper()
	block, _ := pem.Decode(pemBytes)
	if block == nil {
		t.Fatal("no PEM block")
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestIssueKubeconfigLikeTalos(t *testing.T) {
	p := kubetest.PKI(t)
	out, err := kube.IssueKubeconfig("homelab", "https://10.0.0.10:6443", p.CACertPEM, p.CAKeyPEM, 0)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.Load(out)
	if err != nil {
		t.Fatalf("kubeconfig does not load: %v\n%s", err, out)
	}
	if cfg.CurrentContext != "admin@homelab" {
		t.Errorf("current-context = %q, want admin@homelab", cfg.CurrentContext)
	}
	ctx := cfg.Contexts["admin@homelab"]
	if ctx == nil || ctx.Cluster != "homelab" || ctx.AuthInfo != "admin@homelab" || ctx.Namespace != "default" {
		t.Fatalf("context = %+v, want cluster homelab, user admin@homelab, namespace default", ctx)
	}
	cl := cfg.Clusters["homelab"]
	if cl == nil || cl.Server != "https://10.0.0.10:6443" || !bytes.Equal(cl.CertificateAuthorityData, p.CACertPEM) {
		t.Fatalf("cluster = %+v, want the endpoint and the bundle's Kubernetes CA", cl)
	}
	if len(cfg.AuthInfos) != 1 || cfg.AuthInfos["admin@homelab"].Token != "" {
		t.Fatalf("want exactly one certificate user and no token, got %+v", cfg.AuthInfos)
	}
	crt := parseCert(t, cfg.AuthInfos["admin@homelab"].ClientCertificateData)
	if crt.Subject.CommonName != "admin" || len(crt.Subject.Organization) != 1 || crt.Subject.Organization[0] != "system:masters" {
		t.Errorf("client cert subject = %v, want CN=admin O=system:masters", crt.Subject)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(p.CACertPEM)
	if _, err := crt.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("client cert does not verify against the bundle's Kubernetes CA: %v", err)
	}
	if life := time.Until(crt.NotAfter); life < 364*24*time.Hour || life > 366*24*time.Hour {
		t.Errorf("client cert lifetime %s, want Talos' one year", life)
	}

	other := kubetest.PKI(t)
	if _, err := crt.Verify(x509.VerifyOptions{Roots: func() *x509.CertPool {
		p := x509.NewCertPool()
		p.AppendCertsFromPEM(other.CACertPEM)
		return p
	}(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err == nil {
		t.Error("client cert verifies against an unrelated CA")
	}
}

func TestOptionsFromMachineConfig(t *testing.T) {
	bundle := kubetest.NewBundle(t)
	in, err := generate.NewInput("homelab", "https://192.168.1.50:6443", "1.37.0",
		generate.WithSecretsBundle(bundle),
		generate.WithAdditionalSubjectAltNames([]string{"k8s.home.arpa"}),
		generate.WithAllowSchedulingOnControlPlanes(true),
	)
	if err != nil {
		t.Fatal(err)
	}
	cp, err := in.Config(machine.TypeControlPlane)
	if err != nil {
		t.Fatal(err)
	}
	opts, err := kube.OptionsFromMachineConfig(cp)
	if err != nil {
		t.Fatal(err)
	}
	if opts.ClusterName != "homelab" || opts.Endpoint != "https://192.168.1.50:6443" || !opts.ScheduleOnControlPlanes {
		t.Errorf("options = name %q endpoint %q schedule-on-CP %v", opts.ClusterName, opts.Endpoint, opts.ScheduleOnControlPlanes)
	}
	if !bytes.Equal(opts.PKI.CACertPEM, bundle.Certs.K8s.Crt) || !bytes.Equal(opts.PKI.CAKeyPEM, bundle.Certs.K8s.Key) ||
		!bytes.Equal(opts.PKI.ServiceAccountKeyPEM, bundle.Certs.K8sServiceAccount.Key) {
		t.Error("PKI differs from the secrets bundle the config was generated from")
	}
	found := false
	for _, s := range opts.CertSANs {
		found = found || s == "k8s.home.arpa"
	}
	if !found {
		t.Errorf("cert SANs %v miss k8s.home.arpa", opts.CertSANs)
	}
	if opts.ServiceCIDR != "10.96.0.0/12" {
		t.Errorf("service CIDR %q", opts.ServiceCIDR)
	}

	worker, err := in.Config(machine.TypeWorker)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kube.OptionsFromMachineConfig(worker); err == nil {
		t.Error("a worker config (no CA key) was accepted")
	}
}
