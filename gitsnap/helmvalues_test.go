package gitsnap

import (
	"strings"
	"testing"
)

// helmRelease wraps values (indented YAML under spec.values) in a Flux
// HelmRelease.
func helmRelease(values string) []byte {
	var b strings.Builder
	b.WriteString("apiVersion: helm.toolkit.fluxcd.io/v2\nkind: HelmRelease\nmetadata: {name: app}\nspec:\n  interval: 1h\n  values:\n")
	for _, l := range strings.Split(strings.TrimRight(values, "\n"), "\n") {
		b.WriteString("    " + l + "\n")
	}
	return []byte(b.String())
}

// TestHelmValuesHoldSecret: the shapes public homelab trees write in a
// HelmRelease's values that hold no credential (a Secret's name, an
// annotation, a Grafana environment reference, a boolean), beside the
// literals that are credentials and stay withheld.
func TestHelmValuesHoldSecret(t *testing.T) {
	for _, tc := range []struct {
		name, values string
		want         bool
	}{
		// Metadata: Reloader's annotation names the Secret to watch.
		{"reloader pod annotation", "podAnnotations:\n  secret.reloader.stakater.com/reload: dns-secret\n", false},
		{"reloader deployment annotation", "deploymentAnnotations:\n  secret.reloader.stakater.com/reload: dns-secret\n", false},
		{"reloader controller annotation", "controllers:\n  app:\n    annotations:\n      secret.reloader.stakater.com/reload: app-secret\n", false},
		{"label", "podLabels:\n  token-rotation: weekly\n", false},
		{"dns-prefixed key", "ingress:\n  extra:\n    nginx.ingress.kubernetes.io/auth-secret: basic-auth\n", false},
		// A key that names a Secret, with a Secret's name as its value.
		{"githubConfigSecret", "githubConfigSecret: runner-secret\n", false},
		{"envFromSecret", "envFromSecret: grafana-secret\n", false},
		{"configSecret", "alertmanager:\n  alertmanagerSpec:\n    configSecret: alertmanager-config\n", false},
		{"pullSecret", "instance:\n  sync:\n    pullSecret: deploy-key\n", false},
		{"env entry naming a Secret", "env:\n- name: CONFIG_SECRET\n  value: app-config\n", false},
		// Grafana's own references, expanded by Grafana from its environment or a file.
		{"grafana $__env", "grafana.ini:\n  auth.generic_oauth:\n    client_secret: $__env{OIDC_CLIENT_SECRET}\n", false},
		{"grafana $__file", "grafana.ini:\n  database:\n    password: $__file{/etc/secrets/db-password}\n", false},
		// A boolean is configuration.
		{"boolean string", "env:\n  OIDC_USE_ACCESS_TOKEN: \"true\"\n", false},
		{"boolean env entry", "env:\n- name: USE_ACCESS_TOKEN\n  value: \"false\"\n", false},

		// Credentials stay withheld.
		{"password", "auth:\n  password: hunter2-Secret!\n", true},
		{"adminPassword", "adminPassword: \"S3cr3tAdminPass\"\n", true},
		{"github token", "token: ghp_0123456789abcdefghijABCDEFGHIJ012345\n", true},
		{"env entry password", "env:\n- name: DB_PASSWORD\n  value: hunter2\n", true},
		{"numeric password string", "auth:\n  password: \"12345678\"\n", true},
		// Keys ending in Secret that hold the secret itself.
		{"clientSecret name-shaped", "oidc:\n  clientSecret: 3f9a1c0d5e7b2a4c6d8e0f1a3b5c7d9e1f2a4b6c\n", true},
		{"clientSecret short", "oidc:\n  clientSecret: hunter2\n", true},
		{"secret", "cloudflare:\n  secret: tunnelsecret\n", true},
		{"jwtSecret", "jwtSecret: averylongjwtsigningsecret\n", true},
		// A Secret-naming key whose value is not a name.
		{"configSecret not a name", "configSecret: \"Hunter2!Secret\"\n", true},
		{"configSecret token-shaped", "configSecret: a8f3k29dj3k4l5m6n7b8v9c0\n", true},
		// Metadata rules apply only to metadata.
		{"annotations outside values map", "auth:\n  annotationsPassword: hunter2\n", true},
		{"grafana reference beside a literal", "password: $__env{USER}:LiteralS3cretValue9\n", true},
	} {
		if got := helmValuesHoldSecret(helmRelease(tc.values)); got != tc.want {
			t.Errorf("%s: helmValuesHoldSecret = %v, want %v", tc.name, got, tc.want)
		}
	}
}
