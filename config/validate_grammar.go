package config

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/homelab/bootstrap/internal/redact"
	"github.com/homelab/bootstrap/sops"
)

// s3Grammar checks what an S3 endpoint and region may be: a TCP port
// (1-65535), and a region name as S3 clients send it in the signature's
// scope (us-east-1, auto for R2, garage): letters, digits, '-' and '_',
// never a URL. minio-go signs with the region as given, so a wrong one
// fails every request later with SignatureDoesNotMatch.
func (v *validator) s3Grammar() {
	s := v.c.Backup.S3
	if !s.Enabled() {
		return
	}
	if u, err := url.Parse(s.Endpoint); err == nil && u.Host != "" {
		if p, ok := portOf(u); !ok {
			v.errf("backup.s3.endpoint", "port %s of %s is not a TCP port (1-65535)", p, redact.URL(s.Endpoint))
		}
		// The S3 client takes only the scheme and host[:port] of the
		// endpoint: a query or fragment would be dropped without a word.
		if u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || strings.Contains(s.Endpoint, "#") {
			v.errf("backup.s3.endpoint", "%s has a query or a fragment, which the S3 client drops (it uses only the scheme and host[:port]): write https://host[:port], the bucket in backup.s3.bucket and the key prefix in backup.s3.prefix", redact.URL(s.Endpoint))
		}
	}
	// MinIO refuses every object name with a "." or ".." path component
	// (cmd/object-api-utils.go isValidObjectName: hasBadPathComponent),
	// and AWS stores such keys literally ("../" as a name): either way
	// the nightly copy fails or lands where no restore looks.
	for _, comp := range strings.Split(s.Prefix, "/") {
		if comp == "." || comp == ".." {
			v.errf("backup.s3.prefix", "%q has a %q path component: S3 keys are not paths (MinIO refuses such names, AWS keeps them literally); write the prefix without it, e.g. lab/etcd/", s.Prefix, comp)
			break
		}
	}
	switch r := s.Region; {
	case r == "":
	case strings.Contains(r, "://") || strings.Contains(r, "."):
		v.errf("backup.s3.region", "%q is a URL or host, not a region name: the endpoint goes in backup.s3.endpoint, the region is a name such as us-east-1 (MinIO, Garage, SeaweedFS accept their default; R2: auto)", redact.URL(r))
	case !regionName.MatchString(r):
		v.errf("backup.s3.region", "%q is not a region name (letters, digits, '-' and '_', e.g. us-east-1)", r)
	}
}

var regionName = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// snapshotPatterns refuses an empty gitignore pattern in the snapshot's
// lists: the snapshot server refuses it at start, long after validate.
func (v *validator) snapshotPatterns() {
	ls := v.c.Flux.LocalSnapshot
	if ls.Serve != "" && ls.Serve != "build" && ls.Serve != "tree" {
		v.errf("flux.localSnapshot.serve", "%q is not build or tree: build serves what the cluster's build reads (the default), tree every file git lists", ls.Serve)
	}
	for field, list := range map[string][]string{"flux.localSnapshot.exclude": ls.Exclude, "flux.localSnapshot.servePlaintext": ls.ServePlaintext} {
		for i, p := range list {
			if strings.TrimSpace(p) == "" {
				v.errf(fmt.Sprintf("%s[%d]", field, i), "is an empty pattern: remove it, or write the path pattern (gitignore syntax, e.g. docs/)")
			}
		}
	}
}

// placeholder values of the example `config init` writes: an untouched
// example must not read as valid without a word. Hosts under the names
// RFC 2606 reserves (example.com, .org, .net, and github.com/example/)
// can never be reached, and the fingerprint is the example's counting
// pattern.
var (
	examplePlaceholder = regexp.MustCompile(`(?i)(^|[/@.])example\.(com|org|net)([:/]|$)|github\.com/example/`)
	exampleFingerprint = "00:11:22:33:44:55:66:77:88:99:AA:BB:CC:DD:EE:FF:00:11:22:33:44:55:66:77:88:99:AA:BB:CC:DD:EE:FF"
)

// placeholders warns about every value left as the example's placeholder,
// naming the field.
func (v *validator) placeholders() {
	for _, f := range urlFields {
		if raw := f.get(v.c); raw != "" && examplePlaceholder.MatchString(raw) {
			v.warnf(f.path, "%s is a placeholder (a reserved example name no host answers to): put your own", redact.URL(raw))
		}
	}
	if strings.EqualFold(v.c.Proxmox.TLSFingerprint, exampleFingerprint) {
		v.warnf("proxmox.tlsFingerprint", "is the example's placeholder: put your host's SHA-256 fingerprint (Datacenter → node → System → Certificates, or `openssl x509 -noout -fingerprint -sha256 -in /etc/pve/local/pve-ssl.pem` on the host)")
	}
}

// outputPaths checks the files bootstrap writes whose kind the config
// decides: the kubeconfig must be a file, not a directory; the Prometheus
// textfile may be node_exporter's textfile directory (bootstrap.prom is
// written inside, what node_exporter's textfile collector reads: *.prom
// in the directory) or a file, whose directory should exist (warned:
// node_exporter may be installed after bootstrap).
func (v *validator) outputPaths() {
	if k := v.c.State.Kubeconfig; k != "" {
		if st, err := os.Stat(v.c.Resolve(k)); err == nil && st.IsDir() {
			v.errf("state.kubeconfig", "%s is a directory: name the kubeconfig file itself, e.g. %s", k, filepath.Join(k, "kubeconfig"))
		}
	}
	if p := v.c.Postcheck.PrometheusFile; p != "" {
		full := v.c.Resolve(p)
		if st, err := os.Stat(full); err == nil && st.IsDir() {
			return
		}
		if st, err := os.Stat(filepath.Dir(full)); err != nil || !st.IsDir() {
			v.warnf("postcheck.prometheusFile", "%s: its directory %s does not exist yet: the postcheck cannot write the metrics until it does (node_exporter's textfile directory, e.g. /var/lib/node_exporter/textfile_collector)", p, filepath.Dir(p))
		}
	}
}

// PrometheusPath is the file the postcheck writes its metrics to:
// postcheck.prometheusFile, or bootstrap.prom inside it when it names a
// directory (node_exporter's textfile directory). Empty when unset.
func (c *Config) PrometheusPath() string {
	p := c.Postcheck.PrometheusFile
	if p == "" {
		return ""
	}
	full := c.Resolve(p)
	if st, err := os.Stat(full); err == nil && st.IsDir() {
		return filepath.Join(full, "bootstrap.prom")
	}
	return full
}

// ciliumValuesAnyCNI: a Cilium values path that is a directory is refused
// as the NFS one is; a Cilium values file while cni.name is not cilium is
// ignored, and said so.
func (v *validator) ciliumValuesAnyCNI() {
	f := v.c.CNI.Cilium.ValuesFile
	if f == "" {
		return
	}
	if st, err := os.Stat(v.c.Resolve(f)); err == nil && st.IsDir() {
		v.errf("cni.cilium.valuesFile", "%s is a directory: name the values file", f)
		return
	}
	if v.c.CNI.Name != "cilium" {
		v.warnf("cni.cilium.valuesFile", "is set but cni.name is %q: Cilium is not installed and the file is ignored", v.c.CNI.Name)
	}
}

// recipientsOpenHere warns when no age identity where the sops CLI looks
// opens secrets.age.recipients (and no keyFile is named): the run would
// seal the secrets bundle and the configs to keys nothing here can open,
// and the next run could not read them.
func (v *validator) recipientsOpenHere(recipients []string) {
	if len(recipients) == 0 {
		return
	}
	var env LookupEnv
	if v.c.src != nil {
		env = v.c.src.env
	}
	ids, err := sops.LoadIdentities("", env)
	if err == nil {
		if _, ok := ids.Only(recipients); ok {
			return
		}
	}
	v.warnf("secrets.age.recipients", "no age identity here opens them (secrets.age.keyFile unset; none where the sops CLI looks opens these recipients): files sealed to them could not be read back on this machine; set secrets.age.keyFile to the matching key file")
}
