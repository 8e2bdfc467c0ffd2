package config

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	awsconfig "github.com/aws/aws-sdk-go-v2/config"
)

// TestS3CredentialsAsTheAWSSDK resolves backup.s3's credentials for each
// setup a user of the AWS tools has, and holds the result equal to what
// the AWS SDK itself (aws-sdk-go-v2 config, the version go.sum pins)
// resolves for the same environment and files: temporary credentials with
// a session token, the older variable names, AWS_PROFILE, a credentials
// file named by AWS_SHARED_CREDENTIALS_FILE or found at
// ~/.aws/credentials, and that file's INI rules (keys in any case, ':' as
// the separator, inline comments, quotes, CRLF, "[profile x]" ignored).
func TestS3CredentialsAsTheAWSSDK(t *testing.T) {
	home := t.TempDir()
	if err := os.MkdirAll(filepath.Join(home, ".aws"), 0o700); err != nil {
		t.Fatal(err)
	}
	write := func(name, content string) string {
		p := filepath.Join(home, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	defaultFile := write(".aws/credentials", "[default]\r\nAWS_ACCESS_KEY_ID = HOMEKEY\r\naws_secret_access_key=home-secret ; rotated monthly\r\n"+
		"[nas]\naws_access_key_id: NASKEY\naws_secret_access_key = \"nas secret\" # prod\naws_session_token = nas-token\n"+
		"[profile ignored]\naws_access_key_id = NOPE\naws_secret_access_key = nope\n")
	other := write("elsewhere", "# a comment\n; another\n[backup]\n  aws_access_key_id = OTHERKEY\naws_secret_access_key = other#secret\n")
	for _, tc := range []struct {
		name    string
		env     map[string]string
		profile string // backup.s3.profile
	}{
		{"temporary credentials in the environment", map[string]string{"AWS_ACCESS_KEY_ID": "ASIAENV", "AWS_SECRET_ACCESS_KEY": "env-secret", "AWS_SESSION_TOKEN": "env-token"}, ""},
		{"the older variable names", map[string]string{"AWS_ACCESS_KEY": "OLDKEY", "AWS_SECRET_KEY": "old-secret"}, ""},
		{"the default file's default profile", nil, ""},
		{"AWS_PROFILE in the default file, with a session token", map[string]string{"AWS_PROFILE": "nas"}, ""},
		{"AWS_SHARED_CREDENTIALS_FILE and AWS_DEFAULT_PROFILE", map[string]string{"AWS_SHARED_CREDENTIALS_FILE": other, "AWS_DEFAULT_PROFILE": "backup"}, ""},
		{"backup.s3.profile wins over the environment's keys", map[string]string{"AWS_ACCESS_KEY_ID": "ASIAENV", "AWS_SECRET_ACCESS_KEY": "env-secret"}, "nas"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := map[string]string{"HOME": home}
			for k, v := range tc.env {
				env[k] = v
			}
			// The SDK reads the process environment.
			for _, k := range []string{"AWS_ACCESS_KEY_ID", "AWS_ACCESS_KEY", "AWS_SECRET_ACCESS_KEY", "AWS_SECRET_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_PROFILE",
				"AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "HOME"} {
				t.Setenv(k, env[k])
			}
			t.Setenv("AWS_CONFIG_FILE", filepath.Join(home, "no-config"))
			t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
			opts := []func(*awsconfig.LoadOptions) error{}
			if env["AWS_SHARED_CREDENTIALS_FILE"] == "" {
				// The SDK computes ~/.aws/credentials once, at init, from
				// the real $HOME (DefaultSharedCredentialsFiles).
				opts = append(opts, awsconfig.WithSharedCredentialsFiles([]string{defaultFile}))
			}
			if tc.profile != "" {
				opts = append(opts, awsconfig.WithSharedConfigProfile(tc.profile))
			}
			sdk, err := awsconfig.LoadDefaultConfig(context.Background(), opts...)
			if err != nil {
				t.Fatal(err)
			}
			want, err := sdk.Credentials.Retrieve(context.Background())
			if err != nil {
				t.Fatalf("the SDK: %v", err)
			}

			c := &Config{src: &source{env: func(k string) (string, bool) { v, ok := env[k]; return v, ok && v != "" }}}
			c.Backup.S3.Profile = tc.profile
			got, err := c.S3Credentials()
			if err != nil {
				t.Fatal(err)
			}
			if got.AccessKey != want.AccessKeyID || got.SecretKey != want.SecretAccessKey || got.SessionToken != want.SessionToken {
				t.Errorf("got %q/%q/%q from %s, the SDK %q/%q/%q", got.AccessKey, got.SecretKey, got.SessionToken, got.Source, want.AccessKeyID, want.SecretAccessKey, want.SessionToken)
			}
			if strings.Contains(got.Source, got.SecretKey) {
				t.Errorf("the source names the secret: %s", got.Source)
			}
		})
	}
}

// pathStyle: false addresses the bucket as <bucket>.<host>: with an IP
// address for host that cannot resolve, and validate says so; with a
// name, or pathStyle: true, nothing is said.
func TestPathStyleFalseNeedsAName(t *testing.T) {
	dir := t.TempDir()
	if err := os.CopyFS(filepath.Join(dir, "patches"), os.DirFS("testdata/good/patches")); err != nil {
		t.Fatal(err)
	}
	good := string(mustRead(t, "testdata/good/three-plus-two.yaml"))
	for _, tc := range []struct {
		s3   string
		want bool
	}{
		{"endpoint: http://10.0.20.5:9000\n    bucket: backups\n    pathStyle: false", true},
		{"endpoint: http://10.0.20.5:9000\n    bucket: backups\n    pathStyle: true", false},
		{"endpoint: https://s3.nas.example\n    bucket: backups", false},
	} {
		cfg, err := Parse(filepath.Join(dir, "bootstrap.yaml"), []byte(good+"backup:\n  s3:\n    "+tc.s3+"\n"), noEnv)
		if err != nil {
			t.Fatal(err)
		}
		err = cfg.Validate()
		if got := err != nil && strings.Contains(err.Error(), "backup.s3.pathStyle: is false"); got != tc.want {
			t.Errorf("%s: %v", tc.s3, err)
		}
	}
}
