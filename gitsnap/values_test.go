package gitsnap

import "testing"

// TestHoldsNoSecret judges single values: placeholders are served, a
// literal secret beside or inside a placeholder is not.
func TestHoldsNoSecret(t *testing.T) {
	for _, tc := range []struct {
		v    string
		want bool
	}{
		// Placeholders.
		{"${DB_PASSWORD}", true},
		{"postgres://app:${DB_PASSWORD}@db.${DOMAIN}:5432/app", true},
		{"jdbc:postgresql://${DB_HOST}:5432/app?user=app&password=${DB_PASSWORD}", true},
		{"{{ .Values.password | b64enc }}", true},
		{`{{ include "app.fullname" . }}-{{ .Values.x }}`, true},
		{`{{ required "password is required" .Values.password | b64enc }}`, true},
		{`{{ index .Values "db" "password" | b64enc }}`, true},
		{`{{ join "," .Values.hosts }}`, true},
		{`{{ printf "%s:%s" .Values.user .Values.password | b64enc }}`, true},
		{"op://vault/item/password", true},
		{"$__env{OIDC_CLIENT_SECRET}", true},
		{"$__file{/etc/secrets/smtp-password}", true},
		{"ghcr.io/${ORG}/app@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", true},
		// A literal secret on the same line as a placeholder.
		{"jdbc:postgresql://${DB_HOST}:5432/app?user=app&password=JdbcS3cretValue", false},
		{"Server=${DB_HOST};Database=app;User Id=sa;Password=MssqlS3cretValue;", false},
		{`{"auths":{"${REGISTRY}":{"username":"bot","password":"RegistryS3cretValue"}}}`, false},
		{"https://discord.com/api/webhooks/1234567890/WebhookS3cretTokenValue?thread_id=${THREAD_ID}", false},
		{"$__env{DB_USER}:GrafanaLiteralS3cret", false},
		// Templates that write a literal, wherever it stands.
		{`{{ b64enc "ChartFuncS3cretValue" }}`, false},
		{`{{ .Values.password | default "ChartDefaultS3cret" | b64enc }}`, false},
		{`{{ printf "%s" "ChartPrintfS3cret" | b64enc }}`, false},
		{`{{ "ChartPipeS3cretValue" | b64enc }}`, false},
		{`{{ password | default("JinjaDefault1") }}`, false},
		// Flux substitutes only ${var}: a bare $NAME is the value applied.
		{"$DollarS3cretValue", false},
		{"$Passw0rd", false},
	} {
		if got := holdsNoSecret(tc.v); got != tc.want {
			t.Errorf("holdsNoSecret(%q) = %v, want %v", tc.v, got, tc.want)
		}
	}
}
