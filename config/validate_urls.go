package config

import (
	"net/url"
	"regexp"
	"strconv"
	"strings"

	"github.com/homelab/bootstrap/internal/redact"
)

// urlField is a config field holding a URL, and where a credential for
// what it names belongs instead (a clause of the refusal): credentials never go into the config
// file, whose values are printed, logged and kept in reports.
type urlField struct {
	path  string
	get   func(*Config) string
	where string
}

var urlFields = []urlField{
	{"cluster.endpoint", func(c *Config) string { return c.Cluster.Endpoint }, "none belongs here: the API server is reached with the kubeconfig's client certificate"},
	{"cluster.factory", func(c *Config) string { return c.Cluster.Factory }, "none belongs here: the Image Factory is read anonymously (a private one's CA goes in cluster.factoryCAFile)"},
	{"proxmox.url", func(c *Config) string { return c.Proxmox.URL }, "use the API token instead: proxmox.tokenID, with its secret in PROXMOX_TOKEN_SECRET or proxmox.tokenSecretFile"},
	{"proxmox.iso.url", func(c *Config) string { return c.Proxmox.ISO.URL }, "none belongs here: Proxmox keeps a download's URL in its task log; host the ISO without one, or upload it and set proxmox.iso.file"},
	{"storage.nfs.chartRepo", func(c *Config) string { return c.Storage.NFS.ChartRepo }, "put it in Helm's registry config (`helm registry login HOST`, read for oci:// repositories); an https:// repository that needs one: mirror the chart"},
	{"cni.cilium.chartRepo", func(c *Config) string { return c.CNI.Cilium.ChartRepo }, "put it in Helm's registry config (`helm registry login HOST`, read for oci:// repositories); an https:// repository that needs one: mirror the chart"},
	{"flux.repo", func(c *Config) string { return c.Flux.Repo }, "put it in flux.auth.tokenFile or flux.auth.tokenEnv, with the user name in flux.auth.username (https://), or use flux.auth.sshKeyFile (ssh://)"},
	{"flux.manifests", func(c *Config) string { return c.Flux.Manifests }, "none belongs here: download manifests.tar.gz and point flux.manifests at the local file"},
	{"flux.localSnapshot.url", func(c *Config) string { return c.Flux.LocalSnapshot.URL }, "none belongs here: bootstrap creates the snapshot's credential itself (ai/state/<cluster>/gitsnap-auth) and hands it to Flux"},
	{"backup.s3.endpoint", func(c *Config) string { return c.Backup.S3.Endpoint }, "put it in AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or in backup.s3.credentialsFile (0600)"},
}

// envName is an environment variable name as shells and Go's os package
// take it.
var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// tokenShape is a value that is a token rather than a variable's name:
// GitHub's and GitLab's token prefixes, or a long mix of lower and upper
// case letters and digits (variable names are words, mostly upper case).
var tokenShape = regexp.MustCompile(`^(gh[pousr]_|github_pat_|glpat-|glptt-|gldt-)`)

func looksLikeToken(s string) bool {
	if tokenShape.MatchString(s) {
		return true
	}
	var lower, upper, digit bool
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z':
			lower = true
		case r >= 'A' && r <= 'Z':
			upper = true
		case r >= '0' && r <= '9':
			digit = true
		}
	}
	return len(s) >= 24 && lower && upper && digit
}

// MisplacedSecrets returns the credentials typed where no credential
// belongs: inside a URL (user information, secret query values) and a
// token given as flux.auth.tokenEnv instead of a variable's name. Every
// output masks them (validate's messages included), and validate refuses
// the config.
func (c *Config) MisplacedSecrets() []string {
	var out []string
	for _, f := range urlFields {
		out = append(out, redact.URLSecrets(f.get(c))...)
	}
	if t := c.Flux.Auth.TokenEnv; t != "" && (!envName.MatchString(t) || looksLikeToken(t)) {
		out = append(out, t)
	}
	return out
}

// maskMessages masks the misplaced secrets in every problem's message:
// a value quoted back to the user must not be the credential.
func (c *Config) maskMessages(errs *Errors) {
	set := &redact.Set{}
	for _, s := range c.MisplacedSecrets() {
		set.Add(s)
	}
	for _, it := range errs.Items {
		it.Msg = set.String(it.Msg)
	}
}

// misplacedSecrets refuses a credential inside a URL field or as
// tokenEnv's value, naming the field, the value masked and where the
// credential belongs.
func (v *validator) misplacedSecrets() {
	for _, f := range urlFields {
		raw := f.get(v.c)
		if len(redact.URLSecrets(raw)) == 0 {
			continue
		}
		v.errf(f.path, "%s holds a credential (the URL's user information or a secret query value): a credential never goes into the config file, which is printed, logged and archived; %s", redact.URL(raw), f.where)
	}
	t := v.c.Flux.Auth.TokenEnv
	switch {
	case t == "":
	case !envName.MatchString(t) || looksLikeToken(t):
		v.errf("flux.auth.tokenEnv", "holds what looks like the token itself (%d characters, not shown), not the name of an environment variable: export the token (export GITHUB_TOKEN=…) and name the variable here (tokenEnv: GITHUB_TOKEN), or put it in a 0600 file named by flux.auth.tokenFile", len(t))
	}
}

// ociRepository checks an oci:// chart repository as Helm's registry
// client and the OCI distribution spec take it: a lowercase scheme (Helm
// tells OCI from HTTP by the exact prefix oci://), a repository path in
// lowercase (distribution-spec: repository names are
// [a-z0-9]+([._-][a-z0-9]+)*(/…)*), no tag or digest (the version goes in
// chartVersion), no query, and a TCP port.
func (v *validator) ociRepository(path, raw string) {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return
	}
	if strings.EqualFold(scheme, "oci") && scheme != "oci" {
		v.errf(path, "%s: write the scheme in lowercase (oci://): Helm takes any other spelling for an HTTP repository", redact.URL(raw))
		return
	}
	if scheme != "oci" {
		if scheme != strings.ToLower(scheme) {
			v.errf(path, "%s: write the scheme in lowercase (%s://)", redact.URL(raw), strings.ToLower(scheme))
		}
		return
	}
	u, err := url.Parse(raw)
	switch {
	case strings.ContainsAny(rest, " \t"):
		v.errf(path, "%q holds a space: an OCI reference has none", redact.URL(raw))
	case err != nil:
		v.errf(path, "%s is not a URL: %v", redact.URL(raw), err)
	case u.RawQuery != "" || u.Fragment != "":
		v.errf(path, "%s has a query or fragment: an OCI repository is oci://host[:port]/path", redact.URL(raw))
	case u.Port() != "" && !portInRange(u.Port()):
		v.errf(path, "port %s of %s is not a TCP port (1-65535)", u.Port(), redact.URL(raw))
	case strings.Contains(u.Path, "@"):
		v.errf(path, "%s names a digest: the repository goes here, the chart's version in chartVersion", redact.URL(raw))
	case strings.Contains(u.Path, ":"):
		v.errf(path, "%s names a tag: the repository goes here, the chart's version in chartVersion", redact.URL(raw))
	case u.Path != strings.ToLower(u.Path):
		v.errf(path, "%s: an OCI repository path is lowercase (the distribution spec refuses capitals): write %s", redact.URL(raw), strings.ToLower(u.Path))
	}
}

// portOf returns the URL's explicit port and whether it is a TCP port;
// no port is fine.
func portOf(u *url.URL) (string, bool) {
	p := u.Port()
	if p == "" {
		// url.Port drops a port that is not all digits: look at the host.
		if _, after, ok := strings.Cut(u.Host, ":"); ok && !strings.Contains(u.Host, "]") {
			return after, false
		}
		return "", true
	}
	n, err := strconv.Atoi(p)
	return p, err == nil && n >= 1 && n <= 65535
}
