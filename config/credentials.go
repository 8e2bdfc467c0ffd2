package config

import (
	"os"
	"reflect"
	"regexp"
	"strings"
)

// CredentialFile is a file the config names that holds a credential: a
// field tagged secret:"file".
type CredentialFile struct {
	// Field is the field's path, e.g. "backup.s3.credentialsFile".
	Field string
	// File is the value as written in the config.
	File string
	// Path is File resolved (absolute).
	Path string
}

// CredentialFiles lists every credential file the config names, in field
// order, from the secret:"file" mark on the types: a new credential field
// is protected, checked and masked by carrying the mark, nothing else.
func (c *Config) CredentialFiles() []CredentialFile {
	var out []CredentialFile
	for _, f := range credentialFields(reflect.TypeOf(Config{}), "") {
		v := reflect.ValueOf(c).Elem()
		for _, i := range f.index {
			v = v.Field(i)
		}
		if file := v.String(); file != "" {
			out = append(out, CredentialFile{Field: f.path, File: file, Path: c.Resolve(file)})
		}
	}
	return out
}

type credentialField struct {
	path  string
	index []int
}

// credentialFields walks t's fields (nested structs included) for the
// secret:"file" mark. Only string fields may carry it: a list of
// credential files has no use here yet, and a mark the walk could not
// read would protect nothing.
func credentialFields(t reflect.Type, prefix string) []credentialField {
	var out []credentialField
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "" || name == "-" {
			continue
		}
		path := name
		if prefix != "" {
			path = prefix + "." + name
		}
		switch {
		case f.Tag.Get("secret") == "file":
			if f.Type.Kind() != reflect.String {
				panic("config: secret:\"file\" on " + path + ", which is not a string")
			}
			out = append(out, credentialField{path: path, index: []int{i}})
		case f.Type.Kind() == reflect.Struct:
			for _, sub := range credentialFields(f.Type, path) {
				out = append(out, credentialField{path: sub.path, index: append([]int{i}, sub.index...)})
			}
		}
	}
	return out
}

// publicKey names the keys of a credentials file whose values identify
// rather than authenticate (aws_access_key_id, region): masking them would
// mask ordinary words (a key ID such as "homelab" is also the cluster's
// name) without hiding anything secret.
var publicKey = regexp.MustCompile(`(?i)(_id|^user(name)?|^region|^profile|^endpoint|^output)$`)

// CredentialValues reads the credential files and returns the values in
// them to mask in every output: each line that is not a comment, a
// section or a PEM armor line, and the value of each key = value line (an
// AWS credentials file) unless the key only identifies (publicKey). Files that cannot be read give nothing:
// validate reports them.
func (c *Config) CredentialValues() []string {
	var out []string
	for _, f := range c.CredentialFiles() {
		data, err := os.ReadFile(f.Path)
		if err != nil {
			continue
		}
		if whole := strings.TrimSpace(string(data)); whole != "" {
			out = append(out, whole)
		}
		for _, line := range strings.Split(string(data), "\n") {
			l := strings.TrimSpace(line)
			if l == "" || strings.HasPrefix(l, "#") || strings.HasPrefix(l, ";") || strings.HasPrefix(l, "-----") || strings.HasPrefix(l, "[") {
				continue
			}
			out = append(out, l)
			for _, sep := range []string{"=", ":"} {
				if k, v, ok := strings.Cut(l, sep); ok {
					if v = strings.TrimSpace(v); v != "" && !publicKey.MatchString(strings.TrimSpace(k)) {
						out = append(out, v)
					}
					break
				}
			}
		}
	}
	return out
}
