package labca

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"net"
	"testing"
	"time"
)

// A client trusting the CA accepts the leaf for its names and addresses
// only; another lab server's CA does not vouch for it.
func TestLeafVerifiesAgainstItsCAOnly(t *testing.T) {
	spec := Spec{CA: pkix.Name{CommonName: "ca"}, Leaf: pkix.Name{CommonName: "leaf"},
		DNSNames: []string{"pve.lab"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)},
		CALifetime: time.Hour, LeafLifetime: time.Hour}
	a, err := Issue(spec)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Issue(spec)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(a.Leaf.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"pve.lab", "127.0.0.1"} {
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: a.Pool(), DNSName: name}); err != nil {
			t.Errorf("%s with its own CA: %v", name, err)
		}
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: a.Pool(), DNSName: "other.lab"}); err == nil {
		t.Error("a name the leaf was not issued for verified")
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: b.Pool(), DNSName: "pve.lab"}); err == nil {
		t.Error("another CA vouched for the leaf")
	}
}
