package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// The AWS SDK's environment for credentials besides EnvS3AccessKey and
// EnvS3SecretKey (env_config.go of aws-sdk-go-v2 config v1.32.25, which go.sum pins, and
// v1.32.17 alike): the older
// names it falls back to, the session token of temporary credentials, the
// profile and the shared credentials file.
const (
	envS3AccessKeyOld     = "AWS_ACCESS_KEY"
	envS3SecretKeyOld     = "AWS_SECRET_KEY"
	EnvS3SessionToken     = "AWS_SESSION_TOKEN"
	EnvS3Profile          = "AWS_PROFILE"
	envS3DefaultProfile   = "AWS_DEFAULT_PROFILE"
	EnvS3CredentialsFile  = "AWS_SHARED_CREDENTIALS_FILE"
	defaultS3Profile      = "default"
	defaultCredentialsRel = ".aws/credentials"
)

// S3Credentials are backup.s3's credentials and where they were found.
type S3Credentials struct {
	AccessKey, SecretKey string
	// SessionToken is set for temporary credentials (STS, SSO,
	// aws-vault: access keys starting ASIA); it is signed with the keys.
	SessionToken string
	// Source says where they came from, for messages (never a secret).
	Source string
}

// S3Credentials returns backup.s3's credentials, resolved as the AWS SDK
// resolves them (aws-sdk-go-v2 config v1.32.25, as v1.32.17:
// resolve_credentials.go resolveCredentialChain), with backup.s3.profile playing the profile a
// program sets and backup.s3.credentialsFile the shared credentials file
// it names:
//
//  1. backup.s3.profile set: that profile of the shared credentials file;
//  2. else AWS_ACCESS_KEY_ID (or AWS_ACCESS_KEY) and AWS_SECRET_ACCESS_KEY
//     (or AWS_SECRET_KEY), both set, with AWS_SESSION_TOKEN;
//  3. else the shared credentials file's profile $AWS_PROFILE,
//     $AWS_DEFAULT_PROFILE or default.
//
// The shared credentials file is backup.s3.credentialsFile, else
// $AWS_SHARED_CREDENTIALS_FILE, else ~/.aws/credentials. Neither
// ~/.aws/config nor credential_process, SSO or role profiles are read:
// keys and a session token are what an S3-compatible server takes.
func (c *Config) S3Credentials() (S3Credentials, error) {
	creds, field, err := c.resolveS3Credentials(os.ReadFile)
	if err != nil {
		return S3Credentials{}, Userf("%s: %v", field, err)
	}
	return creds, nil
}

// resolveS3Credentials is S3Credentials reading files with read; on
// failure it names the config field the error is about.
func (c *Config) resolveS3Credentials(read func(string) ([]byte, error)) (S3Credentials, string, error) {
	env := c.src.env
	if env == nil {
		env = func(string) (string, bool) { return "", false }
	}
	first := func(names ...string) (string, string) {
		for _, n := range names {
			if v, _ := env(n); v != "" {
				return v, n
			}
		}
		return "", ""
	}
	s := c.Backup.S3
	if s.Profile == "" {
		id, idVar := first(EnvS3AccessKey, envS3AccessKeyOld)
		secret, secretVar := first(EnvS3SecretKey, envS3SecretKeyOld)
		if id != "" && secret != "" {
			token, _ := env(EnvS3SessionToken)
			source := "$" + idVar + " and $" + secretVar
			if token != "" {
				source = "$" + idVar + ", $" + secretVar + " and $" + EnvS3SessionToken
			}
			return S3Credentials{AccessKey: id, SecretKey: secret, SessionToken: token, Source: source}, "", nil
		}
	}
	// The file named in messages as the user wrote it (a resolved path
	// would differ per machine).
	field, file, shown := "backup.s3.credentialsFile", c.Resolve(s.CredentialsFile), s.CredentialsFile
	if s.CredentialsFile == "" {
		field = "backup.s3"
		if s.Profile != "" {
			field = "backup.s3.profile"
		}
		// $HOME, as the SDK's shareddefaults.UserHomeDir reads it.
		if f, _ := env(EnvS3CredentialsFile); f != "" {
			file, shown = f, "$"+EnvS3CredentialsFile+" "+f
		} else if home, _ := env("HOME"); home != "" {
			file = filepath.Join(home, filepath.FromSlash(defaultCredentialsRel))
			shown = "~/" + defaultCredentialsRel
		}
	}
	profile, profileFrom := s.Profile, "backup.s3.profile"
	if profile == "" {
		if p, v := first(EnvS3Profile, envS3DefaultProfile); p != "" {
			profile, profileFrom = p, "$"+v
		} else {
			profile, profileFrom = defaultS3Profile, ""
		}
	}
	noCredentials := fmt.Sprintf("no credentials: set %s and %s (and %s for temporary ones), or point backup.s3.credentialsFile at a 0600 AWS shared credentials file", EnvS3AccessKey, EnvS3SecretKey, EnvS3SessionToken)
	if file == "" {
		return S3Credentials{}, field, errors.New(noCredentials)
	}
	data, err := read(file)
	switch {
	case errors.Is(err, fs.ErrNotExist) && s.CredentialsFile == "" && s.Profile == "":
		return S3Credentials{}, field, fmt.Errorf("%s (%s does not exist)", noCredentials, shown)
	case err != nil:
		return S3Credentials{}, field, fmt.Errorf("%s: %v", shown, unwrapPathErr(err))
	}
	keys, err := sharedCredentials(data, profile)
	if err != nil {
		if profileFrom != "" {
			err = fmt.Errorf("%w (the profile from %s)", err, profileFrom)
		}
		return S3Credentials{}, field, fmt.Errorf("%s: %w", shown, err)
	}
	return S3Credentials{AccessKey: keys[sharedAccessKey], SecretKey: keys[sharedSecretKey], SessionToken: keys[sharedSessionToken],
		Source: fmt.Sprintf("profile [%s] of %s", profile, shown)}, "", nil
}

// The keys of a profile in the shared credentials file (shared_config.go).
const (
	sharedAccessKey    = "aws_access_key_id"
	sharedSecretKey    = "aws_secret_access_key"
	sharedSessionToken = "aws_session_token"
)

// sharedCredentials reads profile's keys from an AWS shared credentials
// file as the SDK's INI reader does (aws-sdk-go-v2 config v1.32.25, as
// v1.32.17: internal/ini tokenize.go, parse.go, strings.go): whole-line comments
// start with # or ;; a property is "key = value" or "key: value" (the
// separator that comes first), its key lower-cased, its value trimmed,
// unquoted, and cut at " #", " ;", "\t#" or "\t;"; an indented line is a
// property of its own when the one before has a value, and a continuation
// otherwise; "[profile x]" sections are not profiles of this file
// (shared_config.go processCredentialsSections). Both keys must be there.
func sharedCredentials(data []byte, profile string) (map[string]string, error) {
	if profile == "" {
		profile = defaultS3Profile
	}
	section, key, found := "", "", false
	keys := map[string]string{}
	for _, line := range strings.Split(string(data), "\n") {
		trimmed := strings.TrimLeft(line, " \t")
		if strings.TrimSpace(line) == "" || strings.HasPrefix(trimmed, "#") || strings.HasPrefix(trimmed, ";") {
			continue
		}
		if name, ok := iniSection(line); ok {
			section, key = name, ""
			found = found || section == profile
			continue
		}
		indented := line[0] == ' ' || line[0] == '\t'
		k, v, ok := iniProperty(line, indented)
		switch {
		case section != profile:
		case ok && (!indented || key == "" || keys[key] != ""):
			key = k
			keys[k] = v
		case indented && !ok && key != "" && keys[key] != "":
			keys[key] += "\n" + trimmed
		}
	}
	switch {
	case !found:
		return nil, fmt.Errorf("no [%s] profile", profile)
	case keys[sharedAccessKey] == "" || keys[sharedSecretKey] == "":
		return nil, fmt.Errorf("profile [%s] lacks %s or %s", profile, sharedAccessKey, sharedSecretKey)
	}
	return keys, nil
}

// iniSection reads "[name]" (a comment after it allowed).
func iniSection(line string) (string, bool) {
	s, _, _ := strings.Cut(line, "#")
	s, _, _ = strings.Cut(s, ";")
	s = strings.TrimSpace(s)
	if !strings.HasPrefix(s, "[") || !strings.HasSuffix(s, "]") {
		return "", false
	}
	fields := strings.Fields(s[1 : len(s)-1])
	return strings.Join(fields, " "), true
}

// iniProperty reads "key = value" or "key: value". An indented line's
// inline comment stays in its value unless it becomes a property of its
// own, as the SDK's sub-properties do.
func iniProperty(line string, indented bool) (key, value string, ok bool) {
	s := strings.TrimLeft(line, " \t")
	if !indented {
		s = cutInlineComment(s)
	}
	eq, colon := strings.Index(s, "="), strings.Index(s, ":")
	sep := "="
	if eq == -1 || colon != -1 && colon < eq {
		sep = ":"
	}
	k, v, ok := strings.Cut(s, sep)
	if !ok {
		return "", "", false
	}
	// Unquoted before an indented line's comment is cut (legacyStrconv,
	// then trimPropertyComment in handleSubProperty).
	v = unquoteINI(strings.TrimSpace(v))
	if indented {
		v = strings.TrimSpace(cutInlineComment(v))
	}
	return strings.ToLower(strings.TrimSpace(k)), v, true
}

func unquoteINI(v string) string {
	if len(v) >= 2 && (v[0] == '"' && v[len(v)-1] == '"' || v[0] == '\'' && v[len(v)-1] == '\'') {
		return v[1 : len(v)-1]
	}
	return v
}

func cutInlineComment(s string) string {
	for _, sep := range []string{" #", " ;", "\t#", "\t;"} {
		s, _, _ = strings.Cut(s, sep)
	}
	return s
}
