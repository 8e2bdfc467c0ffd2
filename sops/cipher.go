package sops

// Value encryption and the MAC, as the sops CLI does them (sops.go Tree
// Encrypt/Decrypt, shouldBeEncrypted and ToBytes, and aes/cipher.go at
// getsops/sops v3.13.2): each value AES-256-GCM under the data key with a
// fresh 32-byte IV and its path ("a:b:") as additional data, written as
// ENC[AES256_GCM,data:…,iv:…,tag:…,type:…]; the MAC a SHA-512 over every
// plaintext value in order (comments excluded), upper-case hex, itself
// encrypted with the file's lastmodified time as additional data.

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha512"
	"encoding/base64"
	"errors"
	"fmt"
	"hash"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// macOnlyEncryptedPrefix starts the MAC's hash when mac_only_encrypted is
// set, so that such a MAC never equals one over every value: the bytes of
// MACOnlyEncryptedInitialization in sops.go at v3.13.2, which every sops
// reader hashes the same way.
var macOnlyEncryptedPrefix = []byte{0x8a, 0x3f, 0xd2, 0xad, 0x54, 0xce, 0x66, 0x52, 0x7b, 0x10, 0x34, 0xf3, 0xd1, 0x47, 0xbe, 0xb, 0xb, 0x97, 0x5b, 0x3b, 0xf4, 0x4f, 0x72, 0xc6, 0xfd, 0xad, 0xec, 0x81, 0x76, 0xf2, 0x7d, 0x69}

// ivSize is the GCM nonce length sops writes (it reads any length).
const ivSize = 32

var encryptedValue = regexp.MustCompile(`^ENC\[AES256_GCM,data:(.+),iv:(.+),tag:(.+),type:(.+)\]`)

// valueBytes is a value as it is hashed into the MAC and encrypted.
func valueBytes(v any) ([]byte, string, error) {
	switch v := v.(type) {
	case string:
		return []byte(v), "str", nil
	case []byte:
		return v, "bytes", nil
	case int:
		return []byte(strconv.Itoa(v)), "int", nil
	case float64:
		return []byte(strconv.FormatFloat(v, 'f', -1, 64)), "float", nil
	case bool:
		if v {
			return []byte("True"), "bool", nil
		}
		return []byte("False"), "bool", nil
	case time.Time:
		b, err := v.MarshalText()
		return b, "time", err
	case comment:
		return []byte(v.text), "comment", nil
	}
	return nil, "", fmt.Errorf("a value of type %T cannot be encrypted", v)
}

func empty(v any) bool {
	switch v := v.(type) {
	case string:
		return v == ""
	case []byte:
		return len(v) == 0
	case comment:
		return v.text == ""
	}
	return false
}

func gcm(key []byte, ivLen int) (cipher.AEAD, error) {
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCMWithNonceSize(block, ivLen)
}

// encryptValue encrypts one value; an empty string stays empty.
func encryptValue(v any, key []byte, additional string) (string, error) {
	if empty(v) {
		return "", nil
	}
	plain, typ, err := valueBytes(v)
	if err != nil {
		return "", err
	}
	iv := make([]byte, ivSize)
	if _, err := rand.Read(iv); err != nil {
		return "", err
	}
	aead, err := gcm(key, ivSize)
	if err != nil {
		return "", err
	}
	out := aead.Seal(nil, iv, plain, []byte(additional))
	tag := len(out) - aead.Overhead()
	return fmt.Sprintf("ENC[AES256_GCM,data:%s,iv:%s,tag:%s,type:%s]",
		base64.StdEncoding.EncodeToString(out[:tag]), base64.StdEncoding.EncodeToString(iv),
		base64.StdEncoding.EncodeToString(out[tag:]), typ), nil
}

// decryptValue opens one encrypted value into the type it was written as.
func decryptValue(s string, key []byte, additional string) (any, error) {
	if s == "" {
		return "", nil
	}
	m := encryptedValue.FindStringSubmatch(s)
	if m == nil {
		return nil, errors.New("the value is not in sops' ENC[AES256_GCM,…] form")
	}
	var parts [3][]byte
	for i := range parts {
		b, err := base64.StdEncoding.DecodeString(m[i+1])
		if err != nil {
			return nil, fmt.Errorf("base64 of the encrypted value: %w", err)
		}
		parts[i] = b
	}
	data, iv, tag := parts[0], parts[1], parts[2]
	aead, err := gcm(key, len(iv))
	if err != nil {
		return nil, err
	}
	plain, err := aead.Open(nil, iv, append(data, tag...), []byte(additional))
	if err != nil {
		return nil, fmt.Errorf("AES-GCM: %w", err)
	}
	switch m[4] {
	case "str":
		return string(plain), nil
	case "int":
		return strconv.Atoi(string(plain))
	case "float":
		return strconv.ParseFloat(string(plain), 64)
	case "bytes":
		return plain, nil
	case "bool":
		return strconv.ParseBool(string(plain))
	case "time":
		var t time.Time
		return t, t.UnmarshalText(plain)
	case "comment":
		return comment{text: string(plain)}, nil
	}
	return nil, fmt.Errorf("unknown encrypted value type %q", m[4])
}

// leafFunc sees every leaf of a tree (a scalar or a comment) with its path
// of keys and the comments above it, level by level, and returns what
// replaces it.
type leafFunc func(v any, path []string, comments [][]string) (any, error)

func walkValue(v any, path []string, comments [][]string, f leafFunc) (any, error) {
	switch v := v.(type) {
	case string, int, bool, float64, time.Time, comment:
		return f(v, path, comments)
	case []byte:
		return f(string(v), path, comments)
	case branch:
		return walkBranch(v, path, comments, f)
	case []any:
		return walkList(v, path, comments, f)
	case nil:
		return nil, nil
	}
	return nil, fmt.Errorf("cannot walk a value of type %T", v)
}

// withLevel returns comments with a new, empty innermost level, sharing
// nothing with the caller's slice.
func withLevel(comments [][]string) [][]string {
	return append(append(make([][]string, 0, len(comments)+1), comments...), nil)
}

func walkList(list []any, path []string, comments [][]string, f leafFunc) ([]any, error) {
	comments = withLevel(comments)
	top := len(comments) - 1
	for i, v := range list {
		c, isComment := v.(comment)
		if isComment {
			comments[top] = append(comments[top], c.text)
		}
		nv, err := walkValue(v, path, comments, f)
		if err != nil {
			return nil, err
		}
		// An encrypted comment in a list stays there as a string value,
		// as the CLI writes it; decrypting it gives the comment back.
		list[i] = nv
		if !isComment {
			comments[top] = nil
		}
	}
	return list, nil
}

func walkBranch(b branch, path []string, comments [][]string, f leafFunc) (branch, error) {
	comments = withLevel(comments)
	top := len(comments) - 1
	for i, it := range b {
		if c, ok := it.key.(comment); ok {
			comments[top] = append(comments[top], c.text)
			nv, err := walkValue(c, path, comments, f)
			if err != nil {
				return nil, err
			}
			// An inline comment stays inline when encrypted; one
			// decrypted comes back as a comment of its own line, as
			// walkBranch does at sops v3.13.2 (the cipher's Comment
			// carries no Inline).
			switch nv := nv.(type) {
			case comment:
				b[i].key = nv
			case string:
				b[i].key = comment{nv, c.inline}
			default:
				return nil, fmt.Errorf("a comment turned into a %T", nv)
			}
			continue
		}
		c, valueIsComment := it.value.(comment)
		if valueIsComment {
			comments[top] = append(comments[top], c.text)
		}
		key, ok := it.key.(string)
		if !ok {
			return nil, fmt.Errorf("the tree has a key that is not a string (%T %v); only string keys are supported", it.key, it.key)
		}
		nv, err := walkValue(it.value, append(path[:len(path):len(path)], key), comments, f)
		if err != nil {
			return nil, err
		}
		b[i].value = nv
		if !valueIsComment {
			comments[top] = nil
		}
	}
	return b, nil
}

// encrypted says whether the leaf at path is encrypted under the file's
// rule (at most one of the six is set; none means unencrypted_suffix).
func (md metadata) encrypted(path []string, comments [][]string, isComment bool) bool {
	anyMatch := func(re string) bool {
		for _, p := range path {
			if ok, _ := regexp.MatchString(re, p); ok {
				return true
			}
		}
		return false
	}
	enc := true
	if md.UnencryptedSuffix != "" && slices.ContainsFunc(path, func(p string) bool { return strings.HasSuffix(p, md.UnencryptedSuffix) }) {
		enc = false
	}
	if md.EncryptedSuffix != "" {
		enc = slices.ContainsFunc(path, func(p string) bool { return strings.HasSuffix(p, md.EncryptedSuffix) })
	}
	if md.UnencryptedRegex != "" && anyMatch(md.UnencryptedRegex) {
		enc = false
	}
	if md.EncryptedRegex != "" {
		enc = anyMatch(md.EncryptedRegex)
	}
	if md.UnencryptedCommentRegex != "" {
		for _, level := range comments {
			for _, c := range level {
				if ok, _ := regexp.MatchString(md.UnencryptedCommentRegex, c); ok {
					enc = false
				}
			}
		}
	}
	if md.EncryptedCommentRegex != "" {
		enc = false
		last := len(comments) - 1
		for i, level := range comments {
			for j, c := range level {
				// A matching comment line does not encrypt itself, only
				// what follows it.
				if isComment && i == last && j == len(level)-1 {
					continue
				}
				if ok, _ := regexp.MatchString(md.EncryptedCommentRegex, c); ok {
					enc = true
				}
			}
		}
	}
	return enc
}

func (md metadata) newMAC() hash.Hash {
	h := sha512.New()
	if md.MACOnlyEncrypted {
		h.Write(macOnlyEncryptedPrefix)
	}
	return h
}

func additionalData(path []string) string { return strings.Join(path, ":") + ":" }

// hashValue adds a plaintext value to the MAC.
func hashValue(mac hash.Hash, v any) error {
	b, _, err := valueBytes(v)
	if err != nil {
		return err
	}
	mac.Write(b)
	return nil
}

// walkDocs walks every document's leaves with f.
func walkDocs(docs []branch, f leafFunc) error {
	for _, doc := range docs {
		if _, err := walkBranch(doc, nil, nil, f); err != nil {
			return err
		}
	}
	return nil
}

// encryptDocs encrypts the documents in place and returns their MAC.
func encryptDocs(docs []branch, md metadata, key []byte) (string, error) {
	mac := md.newMAC()
	err := walkDocs(docs, func(v any, path []string, comments [][]string) (any, error) {
		_, isComment := v.(comment)
		enc := md.encrypted(path, comments, isComment)
		if (!md.MACOnlyEncrypted || enc) && !isComment {
			if err := hashValue(mac, v); err != nil {
				return nil, err
			}
		}
		if !enc {
			return v, nil
		}
		out, err := encryptValue(v, key, additionalData(path))
		if err != nil {
			return nil, fmt.Errorf("encrypting %s: %w", strings.Join(path, "."), err)
		}
		if isComment && md.UnencryptedCommentRegex != "" {
			if ok, _ := regexp.MatchString(md.UnencryptedCommentRegex, out); ok {
				return nil, fmt.Errorf("the encrypted comment %q matches unencrypted_comment_regex, so it could not be decrypted", out)
			}
		}
		return out, nil
	})
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%X", mac.Sum(nil)), nil
}

// decryptDocs decrypts the documents in place and returns the MAC of what
// they hold, under two rules. mac excludes every comment, as sops up to
// v3.13.1 and every sops encryption do. strict is sops v3.13.2's decryption
// (sops.go Tree.Decrypt, commit d1c031eaf "Check some string casts"): it
// excludes only what was stored as a comment, so an encrypted comment in a
// list, which the YAML store keeps as a string item, is hashed once
// decrypted. A file with one fails sops v3.13.2's MAC check, and so
// kustomize-controller v1.9.5's; listComments names where they are.
func decryptDocs(docs []branch, md metadata, key []byte) (mac, strict string, listComments []string, err error) {
	lenient, strictMAC := md.newMAC(), md.newMAC()
	err = walkDocs(docs, func(v any, path []string, comments [][]string) (any, error) {
		c, isComment := v.(comment)
		enc := md.encrypted(path, comments, isComment)
		out := v
		switch {
		case enc && isComment:
			// A comment that does not open was written in clear by an
			// older sops; it stays as it is.
			if d, err := decryptValue(c.text, key, additionalData(path)); err == nil {
				out = d
			}
		case enc:
			s, ok := v.(string)
			if !ok {
				return nil, fmt.Errorf("%s should be encrypted but holds a %T", strings.Join(path, "."), v)
			}
			d, err := decryptValue(s, key, additionalData(path))
			if err != nil {
				return nil, fmt.Errorf("decrypting %s: %w", strings.Join(path, "."), err)
			}
			out = d
		}
		if !md.MACOnlyEncrypted || enc {
			_, stillComment := out.(comment)
			if !stillComment {
				if err := hashValue(lenient, out); err != nil {
					return nil, err
				}
			}
			if !isComment {
				if stillComment {
					listComments = append(listComments, strings.Join(path, "."))
				}
				if err := hashValue(strictMAC, out); err != nil {
					return nil, err
				}
			}
		}
		return out, nil
	})
	if err != nil {
		return "", "", nil, err
	}
	return fmt.Sprintf("%X", lenient.Sum(nil)), fmt.Sprintf("%X", strictMAC.Sum(nil)), listComments, nil
}
