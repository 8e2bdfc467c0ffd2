package pveapi

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// Common is the pve-common release whose JSONSchema.pm checks a PVE
// release's parameters: the one installed when that release's schema dump
// was taken (pve-docs' commit date; pve-common's "bump version" commits).
// The rules that changed between them are flags here.
type Common struct {
	// Version and Commit name the pve-common release read.
	Version, Commit string
	// RequiresText: a missing property another one requires reads
	// "missing property required by '<key>'" (commit 0f0e791, pve-common
	// 9.0.9) instead of "missing property - '<key>' requires this property".
	RequiresText bool
	// AliasRemap: check_object moves an aliased key to its target and
	// refuses both together, parse_property_string refuses a key set
	// twice through its alias (commits 8e6f7eb, 5d84387; pve-common 9.1.9).
	AliasRemap bool
	// BoolDefaultKey: a property string's value without key is read with
	// parse_boolean when the default key is a boolean (commit ac547b8,
	// pve-common 9.0.11).
	BoolDefaultKey bool
	// ShortID: an ID of one character is refused as "cannot be shorter
	// than 2 characters" (commit d43c573, pve-common 9.1.7) rather than
	// "contains illegal characters".
	ShortID bool
	// SizeIB: sizes may end in KiB, MiB, GiB, TiB (commit b6bfb5f,
	// pve-common 9.0.6).
	SizeIB bool
	// QemuServer is the qemu-server release whose named formats
	// (pve-qm-ipconfig, pve-qm-boot, pve-vm-cpu-conf, …) apply.
	QemuServer string
	// GuestPhysBits: the cpu option guest-phys-bits exists (commit
	// 2f3c741b, qemu-server 9.0.18).
	GuestPhysBits bool
}

// commonFor maps a schema release to the pve-common read for it: 8.2.2
// (7f3dc63, 2024-07-30) for 8.2's dump of 2024-07-31, 8.2.9 (5d5b3ab) for
// 8.3's of 2024-11-20, 8.3.1 (85d46b4) for 8.4's of 2025-04-09, 9.0.9
// (f8179d2; 9.0.10 of the same day has the same JSONSchema.pm) for 9.0's of
// 2025-09-05, 9.1.11 (92ce4e4) for 9.1's of 2026-04-30. qemu-server the
// same way: 8.2.4 (00d68b8d), 8.2.8 (7547eb37), 8.3.12 (a411016f), 9.0.20
// (4ce85819), 9.1.9 (6bdc5547).
func commonFor(release string) Common {
	switch release {
	case "8.2":
		return Common{Version: "8.2.2", Commit: "7f3dc63", QemuServer: "8.2.4"}
	case "8.3":
		return Common{Version: "8.2.9", Commit: "5d5b3ab", QemuServer: "8.2.8"}
	case "8.4":
		return Common{Version: "8.3.1", Commit: "85d46b4", QemuServer: "8.3.12"}
	case "9.0":
		return Common{Version: "9.0.9", Commit: "f8179d2", RequiresText: true, SizeIB: true, QemuServer: "9.0.20", GuestPhysBits: true}
	}
	return Common{Version: "9.1.11", Commit: "92ce4e4", RequiresText: true, AliasRemap: true, BoolDefaultKey: true, ShortID: true, SizeIB: true,
		QemuServer: "9.1.9", GuestPhysBits: true}
}

// Errors are PVE's per-parameter errors ({"errors": {"<param>": "<msg>"}}).
type Errors map[string]string

// add is add_error: a second message for one path is joined with the two
// characters \n (single-quoted in Perl).
func (e Errors) add(path, msg string) {
	if path == "" {
		path = "_root"
	}
	if old, ok := e[path]; ok {
		e[path] = old + `\n` + msg
		return
	}
	e[path] = msg
}

// String lists the errors sorted, as PVE's exception text does.
func (e Errors) String() string {
	keys := make([]string, 0, len(e))
	for k := range e {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s: %s\n", k, e[k])
	}
	return b.String()
}

// indexed are the highest indexes + 1 of the indexed options the dump
// writes as "name[n]" (qemu-server 8.2.4 00d68b8d and 9.1.9 6bdc5547 alike:
// src/PVE/QemuServer.pm $MAX_NETS (net and ipconfig), $MAX_SERIAL_PORTS,
// $MAX_PARALLEL_PORTS; QemuServer/Drive.pm $MAX_IDE_DISKS,
// $MAX_SCSI_DISKS, $MAX_VIRTIO_DISKS, $MAX_SATA_DISKS, $MAX_UNUSED_DISKS;
// Memory.pm $MAX_NUMA; PCI.pm $MAX_HOSTPCI_DEVICES; USB.pm
// $MAX_USB_DEVICES; Virtiofs.pm $MAX_VIRTIOFS). Others (containers' mp
// and dev, corosync links, ACME domains) accept any index: unverified.
var indexed = map[string]int{
	"net": 32, "ipconfig": 32, "serial": 4, "parallel": 3,
	"ide": 4, "scsi": 31, "virtio": 16, "sata": 6, "unused": 256,
	"numa": 8, "hostpci": 16, "usb": 14, "virtiofs": 10,
}

var indexedKey = regexp.MustCompile(`^([a-z]+)(\d+)$`)

// prop finds key among props, an indexed one ("scsi0") through its
// "scsi[n]" entry.
func prop(props map[string]*Schema, key string) *Schema {
	if s := props[key]; s != nil {
		return s
	}
	m := indexedKey.FindStringSubmatch(key)
	if m == nil {
		return nil
	}
	s := props[m[1]+"[n]"]
	if s == nil {
		return nil
	}
	if max, ok := indexed[m[1]]; ok {
		n, err := strconv.Atoi(m[2])
		if err != nil || n >= max || (len(m[2]) > 1 && m[2][0] == '0') {
			return nil
		}
	}
	return s
}

// Params validates a request as RESTHandler's handle does: the path's
// parameters merged into the query and body (rest_handler refuses a
// conflicting duplicate), then validate() against the method's parameters.
func (a *API) Params(m *Method, uri map[string]string, params url.Values) Errors {
	errs := Errors{}
	inst := map[string]any{}
	for k, vs := range params {
		if len(vs) > 0 {
			inst[k] = vs[0]
		}
	}
	keys := make([]string, 0, len(uri))
	for k := range uri {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if v, ok := inst[k]; ok && v != uri[k] {
			errs.add(k, "duplicate parameter (already defined in URI) with conflicting values!")
			return errs
		}
		inst[k] = uri[k]
	}
	if m.Parameters == nil {
		return nil
	}
	v := &validator{api: a}
	v.checkProp(inst, m.Parameters, "", errs, "")
	if len(errs) == 0 {
		return nil
	}
	return errs
}

// Result validates an answer's data against the method's returns schema
// (handle with $result_verification: "Result verification failed").
func (a *API) Result(m *Method, data any) Errors {
	if m.Returns == nil {
		return nil
	}
	// Through JSON, as the client sees it.
	b, err := json.Marshal(data)
	if err != nil {
		return Errors{"_root": err.Error()}
	}
	var inst any
	d := json.NewDecoder(strings.NewReader(string(b)))
	d.UseNumber()
	if err := d.Decode(&inst); err != nil {
		return Errors{"_root": err.Error()}
	}
	errs := Errors{}
	v := &validator{api: a}
	v.checkProp(inst, m.Returns, "", errs, "")
	if len(errs) == 0 {
		return nil
	}
	return errs
}

// Value validates one value against a schema (a property string against a
// parameter's sub-options, say).
func (a *API) Value(s *Schema, path string, value any) Errors {
	errs := Errors{}
	(&validator{api: a}).checkProp(value, s, path, errs, "")
	if len(errs) == 0 {
		return nil
	}
	return errs
}

type validator struct{ api *API }

// perlRef is ref($value): HASH, ARRAY, JSON::PP::Boolean, or "".
func perlRef(v any) string {
	switch v.(type) {
	case map[string]any:
		return "HASH"
	case []any:
		return "ARRAY"
	case bool:
		return "JSON::PP::Boolean"
	}
	return ""
}

// perlString is a scalar as Perl prints it.
func perlString(v any) string {
	switch t := v.(type) {
	case nil:
		return ""
	case string:
		return t
	case json.Number:
		return t.String()
	case float64:
		if t == math.Trunc(t) && math.Abs(t) < 1e15 {
			return strconv.FormatInt(int64(t), 10)
		}
		return strconv.FormatFloat(t, 'g', -1, 64)
	case int:
		return strconv.Itoa(t)
	case bool:
		if t {
			return "1"
		}
		return ""
	}
	return fmt.Sprint(v)
}

var (
	isIntegerRE = regexp.MustCompile(`^[+-]?\d+$`)
	isNumberRE  = regexp.MustCompile(`^[+-]?(\d+\.\d+|\d+\.|\.\d+|\d+)([eE][+-]?\d+)?$`)
)

// checkType is check_type for a single type name.
func (v *validator) checkType(path, typ string, value any, errs Errors) bool {
	if typ == "" || typ == "any" {
		return true
	}
	if value == nil {
		return typ == "null"
	}
	if typ == "null" {
		errs.add(path, "type check ('null') failed - value is not null")
		return false
	}
	vt := perlRef(value)
	switch typ {
	case "array":
		if vt != "ARRAY" {
			errs.add(path, "type check ('array') failed")
			return false
		}
		return true
	case "object":
		if vt != "HASH" {
			errs.add(path, "type check ('object') failed")
			return false
		}
		return true
	}
	if vt != "" {
		if typ == "boolean" && vt == "JSON::PP::Boolean" {
			return true
		}
		errs.add(path, fmt.Sprintf("type check ('%s') failed - got %s", typ, vt))
		return false
	}
	s := perlString(value)
	switch typ {
	case "boolean":
		if s == "1" || s == "0" {
			return true
		}
	case "integer":
		if isIntegerRE.MatchString(s) {
			return true
		}
	case "number":
		if isNumberRE.MatchString(s) {
			return true
		}
	default:
		return true
	}
	errs.add(path, fmt.Sprintf("type check ('%s') failed - got '%s'", typ, s))
	return false
}

func join(path, k string) string {
	if path == "" {
		return k
	}
	return path + "." + k
}

// checkObject is check_object.
func (v *validator) checkObject(path string, props map[string]*Schema, value any, additional *bool, addSchema *Schema, errs Errors) {
	obj, ok := value.(map[string]any)
	if !ok {
		errs.add(path, "an object is required")
		return
	}
	if v.api.Common.AliasRemap {
		for _, k := range sortedKeys(obj) {
			sub := prop(props, k)
			if sub == nil || sub.Alias == "" {
				continue
			}
			if _, both := obj[sub.Alias]; both {
				errs.add(join(path, k), fmt.Sprintf("cannot set both '%s' and its alias target '%s'", k, sub.Alias))
				continue
			}
			obj[sub.Alias] = obj[k]
			delete(obj, k)
		}
	}
	for _, k := range sortedKeys(props) {
		if strings.HasSuffix(k, "[n]") {
			// The dump's "scsi[n]" stands for scsi0 … scsiN: each
			// present one is checked below; none is required.
			continue
		}
		val, present := obj[k]
		if !present {
			val = nil
		}
		v.checkProp(val, props[k], join(path, k), errs, instanceType(props, k, obj))
	}
	for _, k := range sortedKeys(obj) {
		np := join(path, k)
		if sub := prop(props, k); sub != nil {
			if strings.HasSuffix(keyOf(props, k), "[n]") {
				v.checkProp(obj[k], sub, np, errs, "")
			}
			if sub.Requires != "" {
				if _, ok := obj[sub.Requires]; !ok {
					if v.api.Common.RequiresText {
						errs.add(join(path, sub.Requires), fmt.Sprintf("missing property required by '%s'", np))
					} else {
						errs.add(join(path, sub.Requires), fmt.Sprintf("missing property - '%s' requires this property", np))
					}
				}
			}
			continue
		}
		if additional != nil && !*additional {
			errs.add(np, "property is not defined in schema and the schema does not allow additional properties")
			continue
		}
		if addSchema != nil {
			v.checkProp(obj[k], addSchema, np, errs, "")
		}
	}
}

// keyOf is the properties key prop found key under.
func keyOf(props map[string]*Schema, key string) string {
	if props[key] != nil {
		return key
	}
	if m := indexedKey.FindStringSubmatch(key); m != nil {
		return m[1] + "[n]"
	}
	return key
}

func instanceType(props map[string]*Schema, k string, obj map[string]any) string {
	if tp := props[k].TypeProperty; tp != "" {
		return perlString(obj[tp])
	}
	return ""
}

func sortedKeys[T any](m map[string]T) []string { return slices.Sorted(maps.Keys(m)) }

// checkProp is check_prop.
func (v *validator) checkProp(value any, s *Schema, path string, errs Errors, instance string) {
	optionalForType := false
	if len(s.OneOf) > 0 {
		if s.TypeProperty != "" {
			optionalForType = true
			for _, inner := range s.OneOf {
				if instance == "" {
					break
				}
				if !contains(inner.InstanceTypes, instance) {
					continue
				}
				optionalForType = inner.Optional
				v.checkProp(value, inner, path, errs, "")
			}
		} else {
			valid := false
			for i, inner := range s.OneOf {
				ie := Errors{}
				v.checkProp(value, inner, fmt.Sprintf("%s.oneOf[%d]", path, i), ie, "")
				if len(ie) == 0 {
					valid = true
					break
				}
			}
			if !valid {
				// check_prop collects the alternatives' errors under
				// their own paths with an undefined message (it reads
				// $inner_errors->{$path}): the parameter is refused.
				errs.add(path, "")
			}
		}
	}
	if s.Alias != "" && (v.api.Common.AliasRemap || value != nil) {
		// Aliases are remapped (9.1.9+) or carry no schema of their own.
		return
	}
	if value == nil {
		if s.Type == "null" {
			return
		}
		if !s.Optional && s.Alias == "" && !optionalForType {
			errs.add(path, "property is missing and it is not optional")
		}
		return
	}
	if !v.checkType(path, s.Type, value, errs) {
		return
	}
	switch t := value.(type) {
	case []any:
		if s.Items != nil {
			for i, el := range t {
				v.checkProp(el, s.Items, fmt.Sprintf("%s[%d]", path, i), errs, "")
			}
		}
		return
	case map[string]any:
		if s.Properties != nil || s.AdditionalProperties != nil && *s.AdditionalProperties {
			props := s.Properties
			if props == nil {
				props = map[string]*Schema{}
			}
			v.checkObject(path, props, value, s.AdditionalProperties, s.AdditionalSchema, errs)
		}
		return
	case bool:
		return
	}
	str := perlString(value)
	if s.FormatProps != nil || s.FormatName != "" {
		if msg := v.checkFormat(s, str, path); msg != "" {
			errs.add(path, "invalid format - "+msg)
			return
		}
	}
	if s.Pattern != "" {
		re, err := s.regexp()
		if err == nil && !re.MatchString(str) {
			errs.add(path, "value does not match the regex pattern")
			return
		}
	}
	if s.MaxLength != nil && len([]rune(str)) > *s.MaxLength {
		errs.add(path, fmt.Sprintf("value may only be %d characters long", *s.MaxLength))
		return
	}
	if s.MinLength != nil && len([]rune(str)) < *s.MinLength {
		errs.add(path, fmt.Sprintf("value must be at least %d characters long", *s.MinLength))
		return
	}
	if isNumberRE.MatchString(str) {
		n, _ := strconv.ParseFloat(str, 64)
		if s.Maximum != nil && n > *s.Maximum {
			errs.add(path, "value must have a maximum value of "+perlString(*s.Maximum))
			return
		}
		if s.Minimum != nil && n < *s.Minimum {
			errs.add(path, "value must have a minimum value of "+perlString(*s.Minimum))
			return
		}
	}
	if s.Enum != nil && !contains(s.Enum, str) {
		errs.add(path, fmt.Sprintf("value '%s' does not have a value in the enumeration '%s'", str, strings.Join(s.Enum, ", ")))
	}
}

func contains(xs []string, x string) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

// checkFormat is check_format; it returns the text the format died with
// ("" when the value passes).
func (v *validator) checkFormat(s *Schema, value, path string) string {
	if s.FormatProps != nil {
		_, msg := v.parsePropertyString(s.FormatProps, value, path)
		return msg
	}
	name := s.FormatName
	if name == "regex" {
		return ""
	}
	base, kind := name, ""
	switch {
	case strings.HasSuffix(name, "-list"):
		base, kind = strings.TrimSuffix(name, "-list"), "list"
	case strings.HasSuffix(name, "-opt"):
		base, kind = strings.TrimSuffix(name, "-opt"), "opt"
	}
	f := v.format(base)
	if f == nil {
		// A format not implemented here passes unchecked (see Unchecked).
		noteUnchecked(name)
		return ""
	}
	switch kind {
	case "list":
		if f.props != nil {
			return fmt.Sprintf("'-%s' format must have code ref, not hash\n", kind)
		}
		for _, item := range splitList(value) {
			if msg := f.check(v, item); msg != "" {
				return msg
			}
		}
		return ""
	case "opt":
		if value == "" || value == "0" {
			return ""
		}
	}
	if f.props != nil {
		_, msg := v.parsePropertyString(f.props, value, path)
		if msg == "" && f.check != nil {
			return f.check(v, value)
		}
		return msg
	}
	return f.check(v, value)
}

// splitList is PVE::Tools::split_list: NUL-separated, else on commas,
// semicolons and white space.
func splitList(s string) []string {
	if strings.Contains(s, "\x00") {
		return strings.Split(s, "\x00")
	}
	s = strings.NewReplacer(",", " ", ";", " ").Replace(s)
	return strings.Fields(s)
}

// parseBoolean is parse_boolean.
func parseBoolean(s string) (string, bool) {
	switch strings.ToLower(s) {
	case "1", "on", "yes", "true":
		return "1", true
	case "0", "off", "no", "false":
		return "0", true
	}
	return s, false
}

var keyValRE = regexp.MustCompile(`^([^=]+)=(.+)$`)

// parsePropertyString is parse_property_string: the parts split on commas,
// "key=value" or a value for the default key, aliases and key aliases
// resolved, booleans read with parse_boolean, then check_object without
// additional properties. The message is what it dies with.
func (v *validator) parsePropertyString(format map[string]*Schema, data, path string) (map[string]any, string) {
	res := map[string]any{}
	defaultKey := ""
	for _, part := range strings.Split(data, ",") {
		if strings.TrimSpace(part) == "" {
			continue
		}
		if m := keyValRE.FindStringSubmatch(part); m != nil {
			k, val := m[1], m[2]
			if _, dup := res[k]; dup {
				return nil, "duplicate key in comma-separated list property: " + k + "\n"
			}
			sch := format[k]
			if sch != nil && sch.Alias != "" {
				if sch.KeyAlias != "" {
					if _, dup := res[sch.KeyAlias]; dup {
						return nil, "key alias '" + sch.KeyAlias + "' is already defined\n"
					}
					res[sch.KeyAlias] = k
				}
				k = sch.Alias
				sch = format[k]
				if _, dup := res[k]; dup && v.api.Common.AliasRemap {
					return nil, "key '" + k + "' is already defined (via alias)\n"
				}
			}
			if sch == nil {
				return nil, "invalid key in comma-separated list property: " + k + "\n"
			}
			if sch.Type == "boolean" {
				val, _ = parseBoolean(val)
			}
			res[k] = val
			continue
		}
		if strings.Contains(part, "=") {
			return nil, "missing key in comma-separated list property\n"
		}
		if defaultKey != "" {
			return nil, "duplicate key in comma-separated list property: " + defaultKey + "\n"
		}
		for _, k := range sortedKeys(format) {
			if !format[k].DefaultKey {
				continue
			}
			defaultKey = k
			if cur, ok := res[k]; ok && perlString(cur) != "" && perlString(cur) != "0" {
				return nil, "duplicate key in comma-separated list property: " + k + "\n"
			}
			if v.api.Common.BoolDefaultKey && format[k].Type == "boolean" {
				part, _ = parseBoolean(part)
			}
			res[k] = part
			break
		}
		if defaultKey == "" {
			return nil, "value without key, but schema does not define a default key\n"
		}
	}
	errs := Errors{}
	no := false
	v.checkObject(path, format, res, &no, nil, errs)
	if len(errs) > 0 {
		return nil, "format error\n" + errs.String()
	}
	return res, ""
}
