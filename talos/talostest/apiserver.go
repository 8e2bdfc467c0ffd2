// Package talostest holds test helpers for code that talks to a Talos
// cluster: a stand-in Kubernetes API server that trusts the cluster's
// Kubernetes CA, as the real one does.
package talostest

import (
	"crypto/tls"
	stdx509 "crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/siderolabs/crypto/x509"
)

// APIServer stands in for kube-apiserver for the calls the talos package
// makes: TLS with a serving certificate from the Kubernetes CA, client
// certificates required and verified against it, /version, the Node list
// and each Node (every listed node Ready with its InternalIP and role
// label, its kubelet at the version /version reports), each control
// plane's mirror pods of kube-apiserver, kube-controller-manager and
// kube-scheduler (Ready) and empty kube-system DaemonSet and Deployment
// lists (no kube-proxy, no CoreDNS). A drain finds only those mirror
// pods (which it leaves), and a Node patch (cordon, annotations) is kept.
type APIServer struct {
	srv        *httptest.Server
	ca         *x509.CertificateAuthority
	caCrt      []byte
	authorized atomic.Int64
	nodes      atomic.Pointer[[]Node]
	// patched holds each Node's spec.unschedulable and annotations as
	// patches left them.
	mu      sync.Mutex
	patched map[string]*nodePatch
	patches int
}

type nodePatch struct {
	Unschedulable bool
	Annotations   map[string]string
}

// Node is a registered node of the stand-in.
type Node struct {
	Name, IP     string
	ControlPlane bool
}

// NewAPIServer starts a stand-in API server for the Kubernetes CA
// (PEM certificate and key) that reports nodes as registered and Ready.
func NewAPIServer(t testing.TB, caCrt, caKey []byte, nodes ...Node) *APIServer {
	t.Helper()
	ca, err := x509.NewCertificateAuthorityFromCertificateAndKey(&x509.PEMEncodedCertificateAndKey{Crt: caCrt, Key: caKey})
	if err != nil {
		t.Fatal(err)
	}
	serving, err := x509.NewKeyPair(ca, x509.IPAddresses([]net.IP{net.ParseIP("127.0.0.1")}), x509.CommonName("kube-apiserver"),
		x509.ExtKeyUsage([]stdx509.ExtKeyUsage{stdx509.ExtKeyUsageServerAuth}))
	if err != nil {
		t.Fatal(err)
	}
	pool := stdx509.NewCertPool()
	pool.AppendCertsFromPEM(caCrt)
	a := &APIServer{ca: ca, caCrt: caCrt, patched: map[string]*nodePatch{}}
	a.SetNodes(nodes...)
	a.srv = httptest.NewUnstartedServer(http.HandlerFunc(a.serve))
	a.srv.TLS = &tls.Config{Certificates: []tls.Certificate{*serving.Certificate}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool}
	a.srv.StartTLS()
	t.Cleanup(a.srv.Close)
	return a
}

func (a *APIServer) serve(w http.ResponseWriter, r *http.Request) {
	if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 {
		http.Error(w, "Unauthorized", http.StatusUnauthorized)
		return
	}
	a.authorized.Add(1)
	w.Header().Set("Content-Type", "application/json")
	switch r.URL.Path {
	case "/version":
		fmt.Fprint(w, `{"major":"1","minor":"36","gitVersion":"v1.36.1","platform":"linux/amd64"}`)
	case "/api/v1/nodes":
		var items []string
		for _, n := range *a.nodes.Load() {
			items = append(items, a.nodeJSON(n))
		}
		fmt.Fprintf(w, `{"kind":"NodeList","apiVersion":"v1","metadata":{},"items":[%s]}`, strings.Join(items, ","))
	case "/api/v1/namespaces/kube-system/pods":
		// Without a selector, every mirror pod; with k8s-app=X, X's (the
		// only selector this stand-in understands).
		selector := r.URL.Query().Get("labelSelector")
		app, selected := strings.CutPrefix(selector, "k8s-app=")
		var items []string
		for _, component := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
			if selector != "" && (!selected || app != component) {
				continue
			}
			items = append(items, a.mirrorPods(component, "")...)
		}
		fmt.Fprintf(w, `{"kind":"PodList","apiVersion":"v1","metadata":{},"items":[%s]}`, strings.Join(items, ","))
	case "/api/v1/pods":
		// A drain's list: the node's mirror pods (field selector
		// spec.nodeName=X, the only one this stand-in understands).
		node, _ := strings.CutPrefix(r.URL.Query().Get("fieldSelector"), "spec.nodeName=")
		var items []string
		for _, component := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
			items = append(items, a.mirrorPods(component, node)...)
		}
		fmt.Fprintf(w, `{"kind":"PodList","apiVersion":"v1","metadata":{},"items":[%s]}`, strings.Join(items, ","))
	case "/apis/apps/v1/namespaces/kube-system/daemonsets":
		fmt.Fprint(w, `{"kind":"DaemonSetList","apiVersion":"apps/v1","metadata":{},"items":[]}`)
	case "/apis/apps/v1/namespaces/kube-system/deployments":
		fmt.Fprint(w, `{"kind":"DeploymentList","apiVersion":"apps/v1","metadata":{},"items":[]}`)
	default:
		if name, ok := strings.CutPrefix(r.URL.Path, "/api/v1/nodes/"); ok {
			if i := slices.IndexFunc(*a.nodes.Load(), func(n Node) bool { return n.Name == name }); i >= 0 {
				if r.Method == http.MethodPatch {
					if err := a.patchNode(name, r.Body); err != nil {
						http.Error(w, err.Error(), http.StatusBadRequest)
						return
					}
				}
				fmt.Fprint(w, a.nodeJSON((*a.nodes.Load())[i]))
				return
			}
		}
		http.NotFound(w, r)
	}
}

func (a *APIServer) nodeJSON(n Node) string {
	role := "node-role.kubernetes.io/worker"
	if n.ControlPlane {
		role = "node-role.kubernetes.io/control-plane"
	}
	a.mu.Lock()
	p := a.patched[n.Name]
	a.mu.Unlock()
	if p == nil {
		p = &nodePatch{}
	}
	ann, _ := json.Marshal(p.Annotations)
	return fmt.Sprintf(`{"kind":"Node","apiVersion":"v1","metadata":{"name":%q,"labels":{%q:""},"annotations":%s},"spec":{"unschedulable":%t},"status":{"addresses":[{"type":"InternalIP","address":%q}],"conditions":[{"type":"Ready","status":"True"}],"nodeInfo":{"kubeletVersion":"v1.36.1"}}}`, n.Name, role, ann, p.Unschedulable, n.IP)
}

// mirrorPods are the control planes' mirror pods of component (on node
// only, when set), marked as the kubelet marks them
// (kubernetes.io/config.mirror), so a drain leaves them.
func (a *APIServer) mirrorPods(component, node string) []string {
	var items []string
	for _, n := range *a.nodes.Load() {
		if n.ControlPlane && (node == "" || node == n.Name) {
			items = append(items, fmt.Sprintf(`{"metadata":{"name":"%s-%s","namespace":"kube-system","labels":{"k8s-app":%q},"annotations":{"kubernetes.io/config.mirror":"stand-in"}},"spec":{"nodeName":%q},"status":{"phase":"Running","conditions":[{"type":"Ready","status":"True"}]}}`, component, n.Name, component, n.Name))
		}
	}
	return items
}

// patchNode applies a merge patch's spec.unschedulable and annotations
// (null removes one), the only Node fields this stand-in keeps.
func (a *APIServer) patchNode(name string, body io.Reader) error {
	var patch struct {
		Metadata struct {
			Annotations map[string]*string `json:"annotations"`
		} `json:"metadata"`
		Spec struct {
			Unschedulable *bool `json:"unschedulable"`
		} `json:"spec"`
	}
	if err := json.NewDecoder(body).Decode(&patch); err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.patches++
	p := a.patched[name]
	if p == nil {
		p = &nodePatch{Annotations: map[string]string{}}
		a.patched[name] = p
	}
	if patch.Spec.Unschedulable != nil {
		p.Unschedulable = *patch.Spec.Unschedulable
	}
	for k, v := range patch.Metadata.Annotations {
		if v == nil {
			delete(p.Annotations, k)
		} else {
			p.Annotations[k] = *v
		}
	}
	return nil
}

// NodePatches counts the Node patches served.
func (a *APIServer) NodePatches() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.patches
}

// Unschedulable reports whether the Node name is cordoned.
func (a *APIServer) Unschedulable(name string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.patched[name] != nil && a.patched[name].Unschedulable
}

// SetNodes replaces the registered nodes.
func (a *APIServer) SetNodes(nodes ...Node) {
	list := append([]Node(nil), nodes...)
	a.nodes.Store(&list)
}

// Authorized counts requests made with a client certificate from the CA.
func (a *APIServer) Authorized() int64 { return a.authorized.Load() }

// Kubeconfig returns an admin kubeconfig for the server, with a client
// certificate issued by the Kubernetes CA of kubeCACrt/kubeCAKey (the
// server's own, or another cluster's to test a refusal), as Talos mints.
func (a *APIServer) Kubeconfig(cluster string, kubeCACrt, kubeCAKey []byte) []byte {
	ca, err := x509.NewCertificateAuthorityFromCertificateAndKey(&x509.PEMEncodedCertificateAndKey{Crt: kubeCACrt, Key: kubeCAKey})
	if err != nil {
		panic(err)
	}
	admin, err := x509.NewKeyPair(ca, x509.CommonName("admin"), x509.Organization("system:masters"),
		x509.ExtKeyUsage([]stdx509.ExtKeyUsage{stdx509.ExtKeyUsageClientAuth}))
	if err != nil {
		panic(err)
	}
	b64 := base64.StdEncoding.EncodeToString
	return fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters:
- name: %[1]s
  cluster:
    server: %[2]s
    certificate-authority-data: %[3]s
users:
- name: admin@%[1]s
  user:
    client-certificate-data: %[4]s
    client-key-data: %[5]s
contexts:
- name: admin@%[1]s
  context:
    cluster: %[1]s
    namespace: default
    user: admin@%[1]s
current-context: admin@%[1]s
`, cluster, a.srv.URL, b64(a.caCrt), b64(admin.CrtPEM), b64(admin.KeyPEM))
}
