package redact

import (
	"strings"
	"testing"
)

// Each shape is masked wherever it stands in a line, and the text around
// it stays readable.
func TestTextMasksEveryShape(t *testing.T) {
	for _, c := range []struct {
		in, secret, keep string
	}{
		{`expected a mapping, got "ntfy://:tk_abcdefghijklmnopqrstuvwxyz012@ntfy.sh/homelab"`, "tk_abcdefghijklmnopqrstuvwxyz012", "ntfy.sh/homelab"},
		{`got "https://AKIAEXAMPLE:wJalrXUtnFEMI0K7MDENG0bPxRfiCY@minio.lan:9000/bucket"`, "wJalrXUtnFEMI0K7MDENG0bPxRfiCY", "minio.lan:9000/bucket"},
		{`flux.auth: "glpat-Abcdefghij0123456789"`, "glpat-Abcdefghij0123456789", "flux.auth"},
		{`open ghp_0123456789abcdefghijABCDEFGHIJ012345: no such file`, "ghp_0123456789abcdefghijABCDEFGHIJ012345", "no such file"},
		{`github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz`, "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz", ""},
		{`token xoxb-1234567890-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx refused`, "xoxb-1234567890-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx", "refused"},
		{`AGE-SECRET-KEY-1QYQSZQGPQYQSZQGPQYQSZQGPQYQSZQGPQYQSZQGPQYQSZQGPQYQSZQGPQYQSZQ is not a recipient`, "QYQSZQGPQYQSZQGPQYQSZQGPQYQSZQGPQYQS", "is not a recipient"},
		{`age-secret-key-1qyqszqgpqyqszqgpqyqszqgpqyqszqgpqyqszqgpqyqszqgpqyqszqgpqyqszq`, "qyqszqgpqyqszqgpqyqszqgpqyqszqgpqyqs", ""},
		{`AGE-SECRET-KEY-PQ-1QYQSZQGPQYQSZQGPQYQSZQGPQYQSZQGPQYQSZQGPQYQSZQGPQYQSZQGPQYQSZQ`, "QYQSZQGPQYQSZQGPQYQSZQGPQYQSZQGPQYQS", ""},
		{`proxmox.tokenID: "bootstrap@pve!homelab=0b9d1c2e-3f4a-4b5c-8d6e-7f8091a2b3c4" is not`, "0b9d1c2e-3f4a-4b5c-8d6e-7f8091a2b3c4", "bootstrap@pve!homelab"},
		{`Authorization: PVEAPIToken=root@pam!ci=0b9d1c2e-3f4a-4b5c-8d6e-7f8091a2b3c4`, "0b9d1c2e-3f4a-4b5c-8d6e-7f8091a2b3c4", "root@pam!ci"},
		{`storage.nfs.server: "nfs://admin:S3cretNfsPw@nas.lan"`, "S3cretNfsPw", "nas.lan"},
		{`"robot:Zq9rTp2LmX8vKw4N@ghcr.io/me/installer:v1.9.0" is not an image`, "Zq9rTp2LmX8vKw4N", "ghcr.io/me/installer:v1.9.0"},
		{`ls-remote https://git.lan/me/repo.git?pass=hunter2hunter2/info/refs`, "hunter2hunter2", "git.lan/me/repo.git"},
		{`https://git.lan/me/repo.git?pwd=hunter2hunter2`, "hunter2hunter2", "git.lan"},
		{`https://git.lan/me/repo.git#access_token=hunter2hunter2`, "hunter2hunter2", "git.lan"},
		{`https://h/x?X-Amz-Signature=abcd1234ef&X-Amz-Date=1`, "abcd1234ef", "X-Amz-Date=1"},
		{`{"url":"https://h/x?a=1\u0026api_key=abcd1234ef"}`, "abcd1234ef", `a=1`},
		{`Post "http://127.0.0.1:8008/_matrix/client/r0/join/%21room:x?access_token=syt_Ym90_LeakedAccessToken_0123456789": EOF`, "LeakedAccessToken", "_matrix/client/r0/join"},
		{`Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U`, "dozjgNryP4J3jVmNHl0w5N", "Authorization"},
		{`key AKIAIOSFODNN7EXAMPLE`, "AKIAIOSFODNN7EXAMPLE", "key"},
		{"-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----", "b3BlbnNzaC1rZXktdjEAAAAA", ""},
	} {
		got := Text(c.in)
		if strings.Contains(got, c.secret) {
			t.Errorf("Text(%q) = %q still holds %q", c.in, got, c.secret)
		}
		if !strings.Contains(got, c.keep) {
			t.Errorf("Text(%q) = %q lost %q", c.in, got, c.keep)
		}
	}
}

// What is not a secret stays as it is: ssh logins, notification options,
// digests, image references, versions, prose.
func TestTextKeepsWhatIsNoSecret(t *testing.T) {
	for _, s := range []string{
		"ssh://git@github.com/me/homelab.git",
		"ntfy://10.0.20.2:8418/topic?scheme=http&priority=high",
		"smtp://mail.lan:25/?from=bootstrap@lab.local&to=admin@lab.local&auth=Plain",
		"ghcr.io/siderolabs/installer:v1.9.0@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
		"factory.talos.dev/installer/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba:v1.9.0",
		"main@sha1:0123456789abcdef0123456789abcdef01234567",
		"the token bootstrap@pve!homelab lacks VM.Allocate on /vms",
		"basic authentication failed; bearer tokens are not used",
		`{"level":"info","msg":"remote branch head","repo":"https://github.com/me/homelab.git"}`,
	} {
		if got := Text(s); got != s {
			t.Errorf("Text(%q) = %q", s, got)
		}
	}
}

// A value meant as a name or a path loses its random-looking words; names
// made of words and versions keep theirs.
func TestValue(t *testing.T) {
	for in, want := range map[string]string{
		"0b9d1c2e-3f4a-4b5c-8d6e-7f8091a2b3c4":                   Mask,
		"/etc/bootstrap/wJalrXUtnFEMI0K7MDENGbPxRfiCYEXAMPLEKEY": "/etc/bootstrap/" + Mask,
		"secrets/pve-token":                                      "secrets/pve-token",
		"talos-v1.9.0-nocloud-amd64.raw.xz":                      "talos-v1.9.0-nocloud-amd64.raw.xz",
		"nfs-subdir-external-provisioner-4.0.18":                 "nfs-subdir-external-provisioner-4.0.18",
		"kube-prometheus-stack-values.yaml":                      "kube-prometheus-stack-values.yaml",
	} {
		if got := Value(in); got != want {
			t.Errorf("Value(%q) = %q, want %q", in, got, want)
		}
	}
}
