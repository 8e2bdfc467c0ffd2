package pveapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// Releases are the PVE minor releases with a published schema, oldest
// first; the files are pve-<release>.json.
var Releases = []string{"8.2", "8.3", "8.4", "9.0", "9.1"}

// Supported is the oldest release the product supports (8.2.4 and later):
// every call it makes must exist in every release from here on.
const Supported = "8.2"

// ReleaseFor picks the schema for a pve-manager version ("8.2.4",
// "9.2.11"). A release without its own dump uses the nearest published one,
// and note says so: 9.2 had none when the dumps were taken (the newest is
// 9.1's), and versions older than 8.2 are older than any dump.
func ReleaseFor(version string) (release, note string) {
	maj, min := majorMinor(version)
	want := fmt.Sprintf("%d.%d", maj, min)
	for _, r := range Releases {
		if r == want {
			return r, ""
		}
	}
	oldest, newest := Releases[0], Releases[len(Releases)-1]
	if olderThan(want, oldest) {
		return oldest, fmt.Sprintf("PVE %s is older than every published schema: %s's is used", want, oldest)
	}
	if olderThan(newest, want) {
		return newest, fmt.Sprintf("no schema of PVE %s was published: %s's is used", want, newest)
	}
	return newest, fmt.Sprintf("no schema of PVE %s: %s's is used", want, newest)
}

func majorMinor(v string) (int, int) {
	parts := strings.SplitN(v, ".", 3)
	maj, _ := strconv.Atoi(parts[0])
	min := 0
	if len(parts) > 1 {
		min, _ = strconv.Atoi(parts[1])
	}
	return maj, min
}

// olderThan compares two "major.minor" releases.
func olderThan(a, b string) bool {
	am, an := majorMinor(a)
	bm, bn := majorMinor(b)
	return am < bm || am == bm && an < bn
}

// Schema is one JSON-Schema-like node of PVE's API schema, with the keys
// pve-common's JSONSchema.pm acts on.
type Schema struct {
	Type      string
	Optional  bool
	Enum      []string
	Pattern   string
	Minimum   *float64
	Maximum   *float64
	MinLength *int
	MaxLength *int
	// FormatName is a named format ("pve-vmid"); FormatProps the
	// sub-options of a property string given inline.
	FormatName  string
	FormatProps map[string]*Schema
	Default     any
	DefaultKey  bool
	Alias       string
	KeyAlias    string
	Properties  map[string]*Schema
	// AdditionalProperties: nil when the schema leaves it out (then
	// anything extra is accepted), else whether extra keys may appear;
	// AdditionalSchema when it is a schema for them.
	AdditionalProperties *bool
	AdditionalSchema     *Schema
	Items                *Schema
	Requires             string
	TypeProperty         string
	InstanceTypes        []string
	OneOf                []*Schema

	reOnce sync.Once
	re     *regexp.Regexp
	reErr  error
}

type rawSchema struct {
	Type                 json.RawMessage    `json:"type"`
	Optional             json.RawMessage    `json:"optional"`
	Enum                 []json.RawMessage  `json:"enum"`
	Pattern              string             `json:"pattern"`
	Minimum              json.RawMessage    `json:"minimum"`
	Maximum              json.RawMessage    `json:"maximum"`
	MinLength            json.RawMessage    `json:"minLength"`
	MaxLength            json.RawMessage    `json:"maxLength"`
	Format               json.RawMessage    `json:"format"`
	Default              any                `json:"default"`
	DefaultKey           json.RawMessage    `json:"default_key"`
	Alias                string             `json:"alias"`
	KeyAlias             string             `json:"keyAlias"`
	Properties           map[string]*Schema `json:"properties"`
	AdditionalProperties json.RawMessage    `json:"additionalProperties"`
	Items                json.RawMessage    `json:"items"`
	Requires             json.RawMessage    `json:"requires"`
	TypeProperty         string             `json:"type-property"`
	InstanceTypes        []string           `json:"instance-types"`
	OneOf                []*Schema          `json:"oneOf"`
}

// perlTrue reads a Perl truth value as the dump has it (1, 0, "1", true).
func perlTrue(m json.RawMessage) bool {
	s := strings.Trim(strings.TrimSpace(string(m)), `"`)
	return s != "" && s != "0" && s != "null" && s != "false"
}

// perlNumber reads a limit written as a number or a numeric string (Perl
// does not tell them apart).
func perlNumber(m json.RawMessage) *float64 {
	t := strings.Trim(strings.TrimSpace(string(m)), `"`)
	if t == "" || t == "null" {
		return nil
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil {
		return nil
	}
	return &f
}

// UnmarshalJSON reads one schema node.
func (s *Schema) UnmarshalJSON(b []byte) error {
	var r rawSchema
	if err := json.Unmarshal(b, &r); err != nil {
		return err
	}
	if len(r.Type) > 0 {
		_ = json.Unmarshal(r.Type, &s.Type) // a list of types appears nowhere in the dumps
	}
	s.Optional = perlTrue(r.Optional)
	for _, e := range r.Enum {
		var v any
		if err := json.Unmarshal(e, &v); err != nil {
			return err
		}
		s.Enum = append(s.Enum, perlString(v))
	}
	s.Pattern = r.Pattern
	s.Minimum, s.Maximum = perlNumber(r.Minimum), perlNumber(r.Maximum)
	if n := perlNumber(r.MinLength); n != nil {
		i := int(*n)
		s.MinLength = &i
	}
	if n := perlNumber(r.MaxLength); n != nil {
		i := int(*n)
		s.MaxLength = &i
	}
	if len(r.Format) > 0 {
		if r.Format[0] == '{' {
			if err := json.Unmarshal(r.Format, &s.FormatProps); err != nil {
				return fmt.Errorf("format: %w", err)
			}
		} else {
			_ = json.Unmarshal(r.Format, &s.FormatName)
		}
	}
	s.Default, s.DefaultKey, s.Alias, s.KeyAlias = r.Default, perlTrue(r.DefaultKey), r.Alias, r.KeyAlias
	s.Properties, s.TypeProperty, s.InstanceTypes, s.OneOf = r.Properties, r.TypeProperty, r.InstanceTypes, r.OneOf
	if a := bytes.TrimSpace(r.AdditionalProperties); len(a) > 0 && string(a) != "null" {
		if a[0] == '{' {
			s.AdditionalSchema = &Schema{}
			if err := json.Unmarshal(a, s.AdditionalSchema); err != nil {
				return err
			}
			t := true
			s.AdditionalProperties = &t
		} else {
			t := perlTrue(a)
			s.AdditionalProperties = &t
		}
	}
	if i := bytes.TrimSpace(r.Items); len(i) > 0 && i[0] == '{' {
		s.Items = &Schema{}
		if err := json.Unmarshal(i, s.Items); err != nil {
			return err
		}
	}
	if q := bytes.TrimSpace(r.Requires); len(q) > 0 && q[0] == '"' {
		_ = json.Unmarshal(q, &s.Requires)
	}
	return nil
}

// regexp is the schema's pattern as Go reads it, anchored as check_prop
// matches it (m/^$pattern$/). Perl's qr// stringifies as (?^:…) or
// (?^i:…); RE2 spells those (?:…) and (?i:…).
func (s *Schema) regexp() (*regexp.Regexp, error) {
	s.reOnce.Do(func() {
		p := strings.NewReplacer("(?^:", "(?:", "(?^i:", "(?i:", "(?^u:", "(?:", "(?^ui:", "(?i:").Replace(s.Pattern)
		s.re, s.reErr = regexp.Compile(`^(?:` + p + `)$`)
	})
	return s.re, s.reErr
}

// Permissions is a method's declared access rule.
type Permissions struct {
	// User is "all" (any authenticated user), "world" (anyone) or empty.
	User string `json:"user"`
	// Check is the check expression: ["perm", path, [privs], "any", 1],
	// ["and", …], ["or", …], ["userid-param", …], …
	Check []any `json:"check"`
}

// Method is one API method of one path.
type Method struct {
	// HTTP is GET, POST, PUT or DELETE; Path the template
	// ("/nodes/{node}/qemu/{vmid}/config").
	HTTP, Path  string
	Name        string       `json:"name"`
	Parameters  *Schema      `json:"parameters"`
	Returns     *Schema      `json:"returns"`
	Permissions *Permissions `json:"permissions"`
	Proxyto     string       `json:"proxyto"`
	AllowToken  bool         `json:"-"`
	Protected   bool         `json:"-"`
}

// Key is "METHOD /path/template".
func (m *Method) Key() string { return m.HTTP + " " + m.Path }

type rawNode struct {
	Path     string                     `json:"path"`
	Children []rawNode                  `json:"children"`
	Info     map[string]json.RawMessage `json:"info"`
}

// node is one path level: literal children, or one parameter child
// (find_handler's levels hold either folders or one regex, never both).
type node struct {
	literal   map[string]*node
	param     *node
	paramName string
	methods   map[string]*Method
}

// API is the schema of one PVE release.
type API struct {
	// Release is "8.2" …; File the path read.
	Release, File string
	// Common is the pve-common version whose JSONSchema.pm validates for
	// this release (see commons).
	Common  Common
	root    *node
	methods map[string]*Method
}

var (
	cacheMu sync.Mutex
	cache   = map[string]*API{}
)

// Load reads pve-<release>.json from dir, once per process.
func Load(dir, release string) (*API, error) {
	file := filepath.Join(dir, "pve-"+release+".json")
	cacheMu.Lock()
	defer cacheMu.Unlock()
	if a := cache[file]; a != nil {
		return a, nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("reading the PVE %s API schema: %w", release, err)
	}
	var tree []rawNode
	if err := json.Unmarshal(b, &tree); err != nil {
		return nil, fmt.Errorf("parsing %s: %w", file, err)
	}
	a := &API{Release: release, File: file, Common: commonFor(release), root: &node{}, methods: map[string]*Method{}}
	var walk func([]rawNode) error
	walk = func(ns []rawNode) error {
		for _, n := range ns {
			for verb, raw := range n.Info {
				m := &Method{HTTP: verb, Path: n.Path}
				if err := json.Unmarshal(raw, m); err != nil {
					return fmt.Errorf("%s %s: %w", verb, n.Path, err)
				}
				var flags struct {
					AllowToken json.RawMessage `json:"allowtoken"`
					Protected  json.RawMessage `json:"protected"`
				}
				_ = json.Unmarshal(raw, &flags)
				m.AllowToken, m.Protected = perlTrue(flags.AllowToken), perlTrue(flags.Protected)
				a.add(m)
			}
			if err := walk(n.Children); err != nil {
				return err
			}
		}
		return nil
	}
	if err := walk(tree); err != nil {
		return nil, fmt.Errorf("reading %s: %w", file, err)
	}
	cache[file] = a
	return a, nil
}

// LoadFor loads the schema for a pve-manager version (see ReleaseFor).
func LoadFor(dir, version string) (*API, string, error) {
	r, note := ReleaseFor(version)
	a, err := Load(dir, r)
	return a, note, err
}

func (a *API) add(m *Method) {
	n := a.root
	for _, seg := range splitPath(m.Path) {
		if strings.HasPrefix(seg, "{") && strings.HasSuffix(seg, "}") {
			if n.param == nil {
				n.param = &node{}
				n.paramName = strings.Trim(seg, "{}")
			}
			n = n.param
			continue
		}
		if n.literal == nil {
			n.literal = map[string]*node{}
		}
		c := n.literal[seg]
		if c == nil {
			c = &node{}
			n.literal[seg] = c
		}
		n = c
	}
	if n.methods == nil {
		n.methods = map[string]*Method{}
	}
	n.methods[m.HTTP] = m
	a.methods[m.Key()] = m
}

func splitPath(p string) []string {
	var out []string
	for _, s := range strings.Split(p, "/") {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
}

// Find is find_handler: the method serving verb on a concrete path, and
// the values of the path's parameters; nil when PVE would answer 501
// "Method '<verb> <path>' not implemented".
func (a *API) Find(verb, path string) (*Method, map[string]string) {
	n := a.root
	uri := map[string]string{}
	for _, seg := range splitPath(path) {
		if c := n.literal[seg]; c != nil {
			n = c
			continue
		}
		if n.param == nil {
			return nil, nil
		}
		uri[n.paramName] = seg
		n = n.param
	}
	m := n.methods[verb]
	if m == nil {
		return nil, nil
	}
	return m, uri
}

// Method returns the method of a template ("GET", "/nodes/{node}/status").
func (a *API) Method(verb, template string) *Method { return a.methods[verb+" "+template] }

// Keys lists every "METHOD /template", sorted.
func (a *API) Keys() []string {
	return slices.Sorted(maps.Keys(a.methods))
}
