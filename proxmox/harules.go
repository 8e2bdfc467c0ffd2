package proxmox

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// Keeping the control planes apart under HA. Placement puts each control
// plane on its own member, but HA moves VMs later (recovery after a
// failure, a member's maintenance mode, the CRS rebalancer), and two
// control planes on one member lose etcd's quorum together with it.
//
// PVE 9 has HA rules (pve-ha-manager 5.0.2, commit 1bc1db5, "api:
// introduce ha rules api endpoints"; 5.2.0 src/PVE/API2/HA/Rules.pm,
// src/PVE/HA/Rules/ResourceAffinity.pm): a resource-affinity rule with
// affinity "negative" keeps its HA resources on separate nodes, and the
// HA stack must follow it ("HA resource affinity rules MUST be
// applied"). The API refuses a rule over resources that are not HA
// resources, one with fewer than two resources, and a negative one with
// more resources than the HA stack has nodes. POST, PUT and DELETE check
// Sys.Console on /, GET Sys.Audit on / (the schema's permissions).
//
// PVE 8 has none of that: HA groups (src/PVE/HA/Groups.pm: nodes with
// priorities, restricted, nofailback) only say where a resource may run,
// never away from what; nothing in pve-ha-manager 4.x keeps two
// resources apart. The precheck and the provision stage say so.

// SeparationSupported says whether PVE v has negative resource-affinity
// rules (9.0 and later).
func SeparationSupported(v Version) bool { return v.Major >= 9 }

// SeparationRuleID is the id of the rule that keeps cluster's control
// planes apart: "bootstrap-<cluster>-cp", any character a config id
// cannot hold replaced by '-' (pve-ha-rule-id is a pve-configid,
// /^[a-z][a-z0-9_-]+$/i: pve-common src/PVE/JSONSchema.pm $CONFIGID_RE).
func SeparationRuleID(cluster string) string {
	id := []byte("bootstrap-" + cluster + "-cp")
	for i, b := range id {
		if !(b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9' || b == '_' || b == '-') {
			id[i] = '-'
		}
	}
	return string(id)
}

// HARule is one HA rule as GET /cluster/ha/rules lists it.
type HARule struct {
	ID, Type, Affinity string
	// Resources are the rule's HA resource ids ("vm:701"), sorted.
	Resources []string
	Disabled  bool
}

// HARules lists the cluster's HA rules of type typ ("" for all).
func (c *Client) HARules(ctx context.Context, typ string) ([]HARule, error) {
	path := "/cluster/ha/rules"
	if typ != "" {
		path += "?" + url.Values{"type": {typ}}.Encode()
	}
	list, err := c.getList(ctx, path)
	if err != nil {
		return nil, err
	}
	out := make([]HARule, 0, len(list))
	for _, m := range list {
		r := HARule{}
		r.ID, _ = m["rule"].(string)
		r.Type, _ = m["type"].(string)
		r.Affinity, _ = m["affinity"].(string)
		res, _ := m["resources"].(string)
		r.Resources = splitSIDs(res)
		r.Disabled = num(m["disable"]) == 1
		out = append(out, r)
	}
	return out, nil
}

// splitSIDs reads a pve-ha-resource-id-list into sorted ids.
func splitSIDs(s string) []string {
	out := strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ';' || r == ' ' })
	sort.Strings(out)
	return slices.Compact(out)
}

// vmSIDs are the HA resource ids of vmids, sorted.
func vmSIDs(vmids []int) []string {
	out := make([]string, 0, len(vmids))
	for _, id := range vmids {
		out = append(out, "vm:"+strconv.Itoa(id))
	}
	sort.Strings(out)
	return slices.Compact(out)
}

// SeparationPlan is what keeping the control planes apart changes.
type SeparationPlan struct {
	ID string
	// Want are the control planes' HA resource ids.
	Want []string
	// Have is the rule as it is, nil when there is none.
	Have *HARule
	// Nodes is how many nodes the cluster has: a negative rule over more
	// resources than that is refused.
	Nodes int
	// Version is the cluster's PVE version: 8.x has no rules.
	Version Version
}

// Skip says why there is no rule to keep ("" when there is one).
func (p SeparationPlan) Skip() string {
	if !SeparationSupported(p.Version) {
		return SeparationUnsupported(p.Version)
	}
	if len(p.Want) < 2 {
		return "one control plane: nothing to keep apart"
	}
	if len(p.Want) > p.Nodes {
		return fmt.Sprintf("%d control planes on a Proxmox cluster of %d nodes cannot each have a node of their own, and PVE refuses a negative resource-affinity rule over more resources than nodes", len(p.Want), p.Nodes)
	}
	return ""
}

// SeparationUnsupported is what PVE v (8.x) cannot do under HA.
func SeparationUnsupported(v Version) string {
	return fmt.Sprintf("PVE %s has no HA rule that keeps VMs apart (HA groups only say which members a VM may run on; negative resource-affinity rules came with PVE 9): HA may put two control planes on one member after a failover, a member's maintenance mode or a rebalance, and etcd loses quorum when that member goes; upgrade to PVE 9 to keep them apart", v)
}

// Converged says whether the rule is there as wanted, or there is none
// to keep.
func (p SeparationPlan) Converged() bool {
	if p.Skip() != "" {
		return true
	}
	h := p.Have
	return h != nil && h.Type == "resource-affinity" && h.Affinity == "negative" && !h.Disabled && slices.Equal(h.Resources, p.Want)
}

// Change describes what Apply does ("" when converged).
func (p SeparationPlan) Change() string {
	switch {
	case p.Converged():
		return ""
	case p.Have == nil:
		return fmt.Sprintf("create HA rule %s (resource-affinity, negative) over %s: HA keeps the control planes on separate members", p.ID, strings.Join(p.Want, ","))
	}
	var parts []string
	if !slices.Equal(p.Have.Resources, p.Want) {
		parts = append(parts, fmt.Sprintf("resources %s (was %s)", strings.Join(p.Want, ","), strings.Join(p.Have.Resources, ",")))
	}
	if p.Have.Affinity != "negative" {
		parts = append(parts, fmt.Sprintf("affinity negative (was %s)", p.Have.Affinity))
	}
	if p.Have.Disabled {
		parts = append(parts, "enabled (was disabled)")
	}
	return fmt.Sprintf("set HA rule %s: %s", p.ID, strings.Join(parts, ", "))
}

// PlanSeparation reads the PVE version, the rule that keeps cluster's
// control planes (vmids) apart and the cluster's node count; on PVE 8 it
// reads only the version (Skip says why). A rule of that id of another
// type is refused: PUT cannot change a rule's type.
func (c *Client) PlanSeparation(ctx context.Context, cluster string, vmids []int) (SeparationPlan, error) {
	p := SeparationPlan{ID: SeparationRuleID(cluster), Want: vmSIDs(vmids)}
	v, err := c.Version(ctx)
	if err != nil {
		return p, err
	}
	p.Version = v
	if !SeparationSupported(v) {
		return p, nil
	}
	rules, err := c.HARules(ctx, "")
	if err != nil {
		return p, fmt.Errorf("reading the HA rules: %w", err)
	}
	for _, r := range rules {
		if r.ID == p.ID {
			if r.Type != "resource-affinity" {
				return p, fmt.Errorf("HA rule %s exists with type %s: it is not the rule that keeps the control planes apart; rename or delete it", r.ID, r.Type)
			}
			p.Have = &r
		}
	}
	nodes, err := c.Nodes(ctx)
	if err != nil {
		return p, err
	}
	p.Nodes = len(nodes)
	return p, nil
}

// ApplySeparation creates the rule or sets its resources, affinity and
// state, as p says. The VMs must be HA resources by now.
func (c *Client) ApplySeparation(ctx context.Context, p SeparationPlan) error {
	if p.Converged() {
		return nil
	}
	res := strings.Join(p.Want, ",")
	if p.Have == nil {
		_, err := c.post(ctx, "/cluster/ha/rules", map[string]any{"rule": p.ID, "type": "resource-affinity", "affinity": "negative",
			"resources": res, "comment": "bootstrap: keeps the Talos control planes on separate members"})
		if err != nil {
			return fmt.Errorf("creating HA rule %s: %w", p.ID, err)
		}
		return nil
	}
	// type is required on update (the schema of PUT /cluster/ha/rules/{rule});
	// disable=0 is dropped by the handler, so a disabled rule is enabled by
	// deleting the option (pve-ha-manager 5.2.0 Rules.pm update_rule).
	params := map[string]any{"type": "resource-affinity", "affinity": "negative", "resources": res}
	if p.Have.Disabled {
		params["delete"] = "disable"
	}
	if _, err := c.put(ctx, "/cluster/ha/rules/"+url.PathEscape(p.ID), params); err != nil {
		return fmt.Errorf("updating HA rule %s: %w", p.ID, err)
	}
	return nil
}

// FindSeparationRule says whether cluster's separation rule exists, and
// its id. On PVE 8 there is none.
func (c *Client) FindSeparationRule(ctx context.Context, cluster string) (string, bool, error) {
	id := SeparationRuleID(cluster)
	v, err := c.Version(ctx)
	if err != nil || !SeparationSupported(v) {
		return id, false, err
	}
	rules, err := c.HARules(ctx, "resource-affinity")
	if err != nil {
		return id, false, fmt.Errorf("reading the HA rules: %w", err)
	}
	return id, slices.ContainsFunc(rules, func(r HARule) bool { return r.ID == id }), nil
}

// DeleteHARule deletes HA rule id (a missing one is no error: the handler
// only drops the key, pve-ha-manager 5.2.0 Rules.pm delete_rule).
func (c *Client) DeleteHARule(ctx context.Context, id string) error {
	if _, err := c.del(ctx, "/cluster/ha/rules/"+url.PathEscape(id)); err != nil {
		return fmt.Errorf("deleting HA rule %s: %w", id, err)
	}
	return nil
}

// DeleteSeparationRule deletes cluster's separation rule when it exists,
// and says whether it did.
func (c *Client) DeleteSeparationRule(ctx context.Context, cluster string) (bool, error) {
	id, ok, err := c.FindSeparationRule(ctx, cluster)
	if err != nil || !ok {
		return false, err
	}
	return true, c.DeleteHARule(ctx, id)
}

// dropFromSeparation takes VM vmid out of cluster's separation rule
// before the VM leaves the HA resources: pve-ha-manager before 5.0.7
// (commit 8102199, "fix #6613") left a deleted resource in the rules, and
// the API refuses a rule of fewer than two resources, so the rule is
// deleted when fewer would remain (as 5.0.7's purge does). The next
// provision run sets the rule again from the config.
func (c *Client) dropFromSeparation(ctx context.Context, cluster string, vmid int) error {
	v, err := c.Version(ctx)
	if err != nil || !SeparationSupported(v) {
		return err
	}
	id, sid := SeparationRuleID(cluster), "vm:"+strconv.Itoa(vmid)
	rules, err := c.HARules(ctx, "resource-affinity")
	if err != nil {
		return fmt.Errorf("reading the HA rules: %w", err)
	}
	for _, r := range rules {
		if r.ID != id || !slices.Contains(r.Resources, sid) {
			continue
		}
		rest := slices.DeleteFunc(slices.Clone(r.Resources), func(s string) bool { return s == sid })
		if len(rest) < 2 {
			_, err = c.del(ctx, "/cluster/ha/rules/"+url.PathEscape(id))
		} else {
			_, err = c.put(ctx, "/cluster/ha/rules/"+url.PathEscape(id), map[string]any{"type": "resource-affinity", "resources": strings.Join(rest, ",")})
		}
		if err != nil {
			return fmt.Errorf("taking %s out of HA rule %s: %w", sid, id, err)
		}
		c.log.Info().Int("vmid", vmid).Str("rule", id).Msg("took the VM out of the HA rule that keeps the control planes apart")
	}
	return nil
}
