package pvesim

import (
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
)

// HA rules (/cluster/ha/rules), as pve-ha-manager 5.2.0 (commit b71218f)
// src/PVE/API2/HA/Rules.pm serves them; the API came with PVE 9.0
// (pve-ha-manager 5.0.2, commit 1bc1db5) and replaced HA groups. On 8.x
// the schema has no such path, so the judge answers 501 before a handler
// runs (schema.go); the handlers say the same without the schema files.
//
// Modelled: the rule store (cluster-wide, as /etc/pve/ha/rules.cfg is),
// its two types with their options (resource-affinity: affinity;
// node-affinity: nodes, strict), the id format, a duplicate id, resources
// that are not HA resources, and the feasibility checks that matter for
// one rule: fewer than two resources, and a negative rule with more
// resources than the HA stack has nodes (ResourceAffinity.pm). Not
// modelled: the checks between rules (positive against negative, against
// node-affinity rules), HA groups and their migration to rules (pvesim
// has no groups, so "have been migrated" holds), digests on update, and
// the CRS scheduler that applies the rules: nothing moves a VM because of
// a rule (docs/lab.md).

// haRules is the cluster's rules.cfg. Its mutex is taken before a
// member's s.mu (the handlers read HA resources and nodes under it), never
// while one is held.
type haRules struct {
	mu    sync.Mutex
	ids   map[string]*haRule
	order int // the last ordinal handed out (get_next_ordinal)
}

// haRule is one section of rules.cfg.
type haRule struct {
	typ       string
	affinity  string
	nodes     string
	strict    bool
	resources []string // sorted sids, as encode_value writes them
	disable   bool
	comment   string
	order     int
}

func newHARules() *haRules { return &haRules{ids: map[string]*haRule{}} }

// configIDRe is pve-common's $CONFIGID_RE (src/PVE/JSONSchema.pm,
// commit f665029), the format pve-ha-rule-id uses.
var configIDRe = regexp.MustCompile(`(?i)^[a-z][a-z0-9_-]+$`)

// haResourceIDRe is pve_verify_ha_resource_id (pve-ha-manager 5.2.0
// src/PVE/HA/Tools.pm).
var haResourceIDRe = regexp.MustCompile(`^[a-z]+:\S+$`)

// HARule is a rule as tests see it.
type HARule struct {
	ID, Type, Affinity string
	Resources          []string
	Disable            bool
	Comment            string
}

// HARules lists the cluster's HA rules by id.
func (s *Server) HARules() []HARule {
	st := s.haRules
	st.mu.Lock()
	defer st.mu.Unlock()
	var out []HARule
	for id, r := range st.ids {
		out = append(out, HARule{ID: id, Type: r.typ, Affinity: r.affinity, Resources: slices.Clone(r.resources), Disable: r.disable, Comment: r.comment})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// rulesAllowed is what every rules call checks first: the release has
// the rules API (without it, find_handler's 501 when no schema judges the
// call), and the caller holds priv on / (Sys.Audit to read, Sys.Console
// to change: Rules.pm's permissions).
func (s *Server) rulesAllowed(r *request, priv string) *apiError {
	if s.major() < 9 {
		return errf(501, "Method '%s %s' not implemented", r.method, r.path)
	}
	return r.who.check("/", priv)
}

// haNodeCount is the number of nodes the HA stack knows (Rules.pm
// $check_feasibility reads manager_status' node_status); pvesim counts
// the cluster's nodes, as a running CRM would have them all.
func (s *Server) haNodeCount() int {
	l, _ := s.listNodes().([]any)
	return len(l)
}

// haConfigured is PVE::HA::Config::service_is_configured for a "vm:<id>".
func (s *Server) haConfigured(sid string) bool {
	if !strings.HasPrefix(sid, "vm:") {
		return false
	}
	id, ok := haSIDVMID(sid)
	if !ok {
		return false
	}
	m := s.MemberOf(id)
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok = m.ha[id]
	return ok
}

// parseRuleOpts is the plugin's check_config (pve-common
// src/PVE/SectionConfig.pm): every option given must be one of the
// type's (resource-affinity: resources, affinity, disable, comment;
// node-affinity: resources, nodes, strict, disable, comment), and on
// create every required one must be there.
func parseRuleOpts(r *request, typ string, create bool) (map[string]string, *apiError) {
	allowed := map[string]bool{"resources": true, "disable": true, "comment": true}
	required := []string{"resources"}
	switch typ {
	case "resource-affinity":
		allowed["affinity"] = true
		required = append(required, "affinity")
	case "node-affinity":
		allowed["nodes"], allowed["strict"] = true, true
		required = append(required, "nodes")
	default:
		return nil, errf(500, "unknown section type '%s'", typ)
	}
	opts := map[string]string{}
	for k := range r.params {
		switch k {
		case "rule", "type", "delete", "digest":
			continue
		}
		if !allowed[k] {
			return nil, errf(500, "unexpected property '%s'", k)
		}
		opts[k] = r.param(k)
	}
	if create {
		for _, k := range required {
			if _, ok := opts[k]; !ok {
				return nil, errf(500, "missing value for required option '%s'", k)
			}
		}
	}
	if v, ok := opts["affinity"]; ok && v != "positive" && v != "negative" {
		return nil, paramErr(map[string]string{"affinity": "value '" + v + "' does not have a value in the enumeration 'positive, negative'"})
	}
	return opts, nil
}

// splitResources is decode_value's 'resources' (PVE::Tools::split_list
// and pve_verify_ha_resource_id): a set, kept sorted.
func splitResources(v string) ([]string, *apiError) {
	var out []string
	for _, sid := range strings.FieldsFunc(v, func(r rune) bool { return r == ',' || r == ';' || r == ' ' || r == '\t' }) {
		if !haResourceIDRe.MatchString(sid) {
			return nil, errf(500, "value does not look like a valid ha resource id")
		}
		if !slices.Contains(out, sid) {
			out = append(out, sid)
		}
	}
	sort.Strings(out)
	return out, nil
}

// assertResources is Rules.pm $assert_valid_resources_param.
func (s *Server) assertResources(res []string) *apiError {
	if len(res) == 0 {
		return errf(500, "no resources were specified")
	}
	var unmanaged []string
	for _, sid := range res {
		if !s.haConfigured(sid) {
			unmanaged = append(unmanaged, sid)
		}
	}
	if len(unmanaged) > 0 {
		return errf(500, "cannot use unmanaged resource(s) %s.", strings.Join(unmanaged, ", "))
	}
	return nil
}

// feasibility is Rules.pm $assert_feasibility for one rule: a
// PVE::Exception (400, "Rule '<id>' is invalid.", errors per option)
// thrown inside lock_ha_domain, which stringifies it under its own
// message, so the answer is a plain 500 whose text holds code, message
// and errors (pve-common src/PVE/Exception.pm stringify).
func (s *Server) feasibility(id string, rule *haRule, lockMsg string) *apiError {
	if rule.disable || rule.typ != "resource-affinity" {
		return nil
	}
	var errs []string
	if len(rule.resources) < 2 {
		errs = append(errs, "rule is ineffective as there are less than two resources")
	}
	if rule.affinity == "negative" && len(rule.resources) > s.haNodeCount() {
		errs = append(errs, "rule defines more resources than available nodes")
	}
	if len(errs) == 0 {
		return nil
	}
	return errf(500, "%s: 400 Rule '%s' is invalid.\nresources: %s\n", lockMsg, id, strings.Join(errs, ", "))
}

// haRulesIndex answers GET /cluster/ha/rules (Rules.pm index): Sys.Audit
// on /, sorted by order, each rule with its options, digest and order,
// filtered by type and resource when asked.
func (s *Server) haRulesIndex(r *request) (any, *apiError) {
	if aerr := s.rulesAllowed(r, "Sys.Audit"); aerr != nil {
		return nil, aerr
	}
	st := s.haRules
	st.mu.Lock()
	defer st.mu.Unlock()
	ids := make([]string, 0, len(st.ids))
	for id := range st.ids {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return st.ids[ids[i]].order < st.ids[ids[j]].order })
	out := []any{}
	for _, id := range ids {
		rule := st.ids[id]
		if t := r.param("type"); t != "" && t != rule.typ {
			continue
		}
		if sid := r.param("resource"); sid != "" && !slices.Contains(rule.resources, sid) {
			continue
		}
		out = append(out, ruleEntry(id, rule))
	}
	return out, nil
}

// haRuleRead answers GET /cluster/ha/rules/{rule} (Rules.pm read_rule).
func (s *Server) haRuleRead(r *request, id string) (any, *apiError) {
	if aerr := s.rulesAllowed(r, "Sys.Audit"); aerr != nil {
		return nil, aerr
	}
	st := s.haRules
	st.mu.Lock()
	defer st.mu.Unlock()
	rule, ok := st.ids[id]
	if !ok {
		return nil, errf(500, "no such ha rule '%s'", id)
	}
	return ruleEntry(id, rule), nil
}

// ruleEntry is $get_api_ha_rule: the rule's options, resources encoded as
// a sorted list, its id, order and the config's digest.
func ruleEntry(id string, rule *haRule) map[string]any {
	e := map[string]any{"rule": id, "type": rule.typ, "resources": strings.Join(rule.resources, ","),
		"order": rule.order, "digest": randHex(20)}
	if rule.affinity != "" {
		e["affinity"] = rule.affinity
	}
	if rule.nodes != "" {
		e["nodes"] = rule.nodes
		e["strict"] = boolInt(rule.strict)
	}
	if rule.disable {
		e["disable"] = 1
	}
	if rule.comment != "" {
		e["comment"] = rule.comment
	}
	return e
}

// haRuleCreate answers POST /cluster/ha/rules (Rules.pm create_rule):
// Sys.Console on /, quorum, the type's options, then inside the HA
// domain lock ("create ha rule failed: ...") a duplicate id, resources
// that are not HA resources, and the rule's feasibility.
func (s *Server) haRuleCreate(r *request) (any, *apiError) {
	if aerr := s.rulesAllowed(r, "Sys.Console"); aerr != nil {
		return nil, aerr
	}
	if aerr := s.quorumErr(); aerr != nil {
		return nil, aerr
	}
	id, typ := r.param("rule"), r.param("type")
	if !configIDRe.MatchString(id) {
		return nil, paramErr(map[string]string{"rule": "invalid configuration ID '" + id + "'"})
	}
	opts, aerr := parseRuleOpts(r, typ, true)
	if aerr != nil {
		return nil, aerr
	}
	res, aerr := splitResources(opts["resources"])
	if aerr != nil {
		return nil, aerr
	}
	rule := &haRule{typ: typ, affinity: opts["affinity"], nodes: opts["nodes"], strict: truthy(opts["strict"]),
		resources: res, disable: truthy(opts["disable"]), comment: opts["comment"]}
	const lockMsg = "create ha rule failed"
	st := s.haRules
	st.mu.Lock()
	defer st.mu.Unlock()
	if _, dup := st.ids[id]; dup {
		return nil, errf(500, "%s: HA rule '%s' already defined", lockMsg, id)
	}
	if aerr := s.assertResources(res); aerr != nil {
		return nil, errf(500, "%s: %s", lockMsg, aerr.msg)
	}
	if aerr := s.feasibility(id, rule, lockMsg); aerr != nil {
		return nil, aerr
	}
	st.order++
	rule.order = st.order
	st.ids[id] = rule
	return nil, nil
}

// haRuleUpdate answers PUT /cluster/ha/rules/{rule} (Rules.pm
// update_rule): Sys.Console on /; inside the lock ("update HA rules
// failed: ..."): the rule must exist, its type's options only, new
// resources must be HA resources, 'delete' drops options, and the result
// must be feasible. disable=0 is dropped, as the handler does: only
// delete=disable enables a rule again.
func (s *Server) haRuleUpdate(r *request, id string) (any, *apiError) {
	if aerr := s.rulesAllowed(r, "Sys.Console"); aerr != nil {
		return nil, aerr
	}
	const lockMsg = "update HA rules failed"
	st := s.haRules
	st.mu.Lock()
	defer st.mu.Unlock()
	old, ok := st.ids[id]
	if !ok {
		return nil, errf(500, "%s: HA rule '%s' does not exist", lockMsg, id)
	}
	opts, aerr := parseRuleOpts(r, old.typ, false)
	if aerr != nil {
		return nil, errf(500, "%s: %s", lockMsg, aerr.msg)
	}
	rule := *old
	if v, ok := opts["resources"]; ok {
		res, aerr := splitResources(v)
		if aerr != nil {
			return nil, errf(500, "%s: %s", lockMsg, aerr.msg)
		}
		if aerr := s.assertResources(res); aerr != nil {
			return nil, errf(500, "%s: %s", lockMsg, aerr.msg)
		}
		rule.resources = res
	}
	for _, k := range strings.FieldsFunc(r.param("delete"), func(r rune) bool { return r == ',' || r == ';' || r == ' ' }) {
		switch k {
		case "disable":
			rule.disable = false
		case "comment":
			rule.comment = ""
		case "strict":
			rule.strict = false
		}
	}
	if v, ok := opts["affinity"]; ok {
		rule.affinity = v
	}
	if v, ok := opts["comment"]; ok {
		rule.comment = v
	}
	if truthy(opts["disable"]) {
		rule.disable = true
	}
	if aerr := s.feasibility(id, &rule, lockMsg); aerr != nil {
		return nil, aerr
	}
	*old = rule
	return nil, nil
}

// haRuleDelete answers DELETE /cluster/ha/rules/{rule} (Rules.pm
// delete_rule): Sys.Console on /; deleting a rule that does not exist
// succeeds (the handler only deletes the key).
func (s *Server) haRuleDelete(r *request, id string) (any, *apiError) {
	if aerr := s.rulesAllowed(r, "Sys.Console"); aerr != nil {
		return nil, aerr
	}
	st := s.haRules
	st.mu.Lock()
	delete(st.ids, id)
	st.mu.Unlock()
	return nil, nil
}

// purgeFromRules is delete_service_from_config's purge (pve-ha-manager
// 5.0.7, commit 8102199 "fix #6613: update rules containing the resource
// to be deleted"; src/PVE/HA/Config.pm): the resource leaves every rule,
// and a rule left without resources is deleted. Earlier 9.0 releases
// kept the resource in the rules; pvesim purges from 9.1 on, whose
// schema has the 'purge' parameter.
func (s *Server) purgeFromRules(sid string) {
	st := s.haRules
	st.mu.Lock()
	defer st.mu.Unlock()
	for id, rule := range st.ids {
		rule.resources = slices.DeleteFunc(rule.resources, func(x string) bool { return x == sid })
		if len(rule.resources) == 0 {
			delete(st.ids, id)
		}
	}
}

func truthy(v string) bool { return v == "1" || v == "true" || v == "yes" || v == "on" }
