package proxmox

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/homelab/bootstrap/check"
)

// qemuServerTagsOnCreate is the qemu-server release whose create checks
// tags (commit a929b3e0 "vm_create: check tag permissions if setting
// tags", in 9.2.0 b69480d6; not in 9.1.19 41ffc59e nor 8.4.10).
var qemuServerTagsOnCreate = [3]int{9, 2, 0}

// createChecksTags says whether creating a VM on member checks its tags:
// the member's installed qemu-server decides, read from apt/versions. A
// pve-manager 9.2 host may run qemu-server 9.1.13-9.1.19 (pve-manager
// 9.2.0-9.2.4 came out before qemu-server 9.2.0; 9.2.11's debian/control
// still asks only qemu-server >= 9.1.13). When the package list cannot be
// read, pve-manager 9.2 and later are taken to check (the stricter
// answer) and the reason says so.
func (f *facts) createChecksTags(ctx context.Context, member string) (bool, string) {
	c := f.c.On(member)
	qs, found, err := c.InstalledPackage(ctx, "qemu-server")
	if err == nil && found {
		checks := qs.AtLeastPatch(qemuServerTagsOnCreate[0], qemuServerTagsOnCreate[1], qemuServerTagsOnCreate[2])
		return checks, fmt.Sprintf("qemu-server %s on %s", qs, member)
	}
	v, verr := f.getVersion(ctx)
	why := "qemu-server is not in its package list"
	if err != nil {
		why = fmt.Sprintf("its package list is unreadable: %v", err)
	}
	if verr != nil {
		return true, fmt.Sprintf("%s (%s)", member, why)
	}
	return v.AtLeast(9, 2), fmt.Sprintf("Proxmox VE %s on %s (%s)", v, member, why)
}

// checkTags proves the tags the run sets can be set: the tags of the VMs
// it creates, and the tags it adds to adopted VMs that lost them.
//
// A create checks no tag before qemu-server 9.2.0
// ($check_vm_modify_config_perm skips them: qemu-server
// src/PVE/API2/Qemu.pm at 8.4.10 and 9.1.19). From 9.2.0 the create task
// runs assert_tag_permissions (pve-guest-common 6.0.2
// src/PVE/GuestHelpers.pm): without Sys.Modify on /, each tag must be
// allowed by datacenter.cfg's user-tag-access and not be a registered
// tag; and as create passes an empty hash for the old tags, which the
// check reads as a tag "HASH(0x…)" being removed, any policy but free
// refuses every tag (qemu-server 9.2.6).
//
// An update runs assert_tag_permissions for every added or removed tag
// on every version ($update_vm_api, qemu-server 8.4.10 and 9.2.6): the
// tags added to an adopted VM are checked with its real old tags, so only
// the policy and registered tags matter there.
//
// GET /cluster/options tells the policy with Sys.Audit on /.
func (f *facts) checkTags(ctx context.Context) (check.Status, string) {
	ps, placed, err := f.placedPlans(ctx)
	if err != nil {
		return check.Failf("%v", err)
	}
	created := map[string]map[string]bool{} // member → tags of the VMs created there
	added := map[string]bool{}
	for _, s := range placed {
		p, ok := ps.plans[s.VMID]
		if ok && !p.Create && !p.WaitCreate {
			if want, ok := p.Update["tags"]; ok && p.Config != nil {
				have := map[string]bool{}
				for _, t := range p.Config.Tags {
					have[t] = true
				}
				for _, t := range splitTagList(want) {
					if !have[t] {
						added[t] = true
					}
				}
			}
			continue
		}
		node := s.Node
		if node == "" {
			node = f.c.node
		}
		if created[node] == nil {
			created[node] = map[string]bool{}
		}
		for _, t := range s.Tags() {
			created[node][t] = true
		}
	}
	// The tags a check will judge, and why each is judged.
	judged := map[string]bool{}
	for t := range added {
		judged[t] = true
	}
	var unchecked, checkedOn []string
	createAll := map[string]bool{}
	for _, m := range sortedKeys(mapKeys(created)) {
		for t := range created[m] {
			createAll[t] = true
		}
		checks, where := f.createChecksTags(ctx, m)
		if !checks {
			unchecked = append(unchecked, where)
			continue
		}
		checkedOn = append(checkedOn, where)
		for t := range created[m] {
			judged[t] = true
		}
	}
	if len(createAll) == 0 && len(added) == 0 {
		return check.Passf("no new tags to set")
	}
	if len(judged) == 0 {
		return check.Passf("tags %s: %s does not check the tags of a VM it creates (qemu-server checks them from 9.2.0)",
			strings.Join(sortedKeys(createAll), ", "), strings.Join(unchecked, ", "))
	}
	tags := strings.Join(sortedKeys(judged), ", ")
	held, err := f.c.Permissions(ctx, []string{"/"})
	if err != nil {
		return check.Failf("cannot read the token's permissions: %v", err)
	}
	if held["/"]["Sys.Modify"] {
		return check.Passf("Sys.Modify on / allows any tag")
	}
	var what []string
	if len(checkedOn) > 0 {
		what = append(what, "creating a VM with tags ("+strings.Join(checkedOn, ", ")+")")
	}
	if len(added) > 0 {
		what = append(what, "adding the tags "+strings.Join(sortedKeys(added), ", ")+" to adopted VMs")
	}
	policy, err := f.c.TagPolicy(ctx)
	if err != nil {
		return check.Failf("cannot read the datacenter tag policy: %v", err)
	}
	if !policy.Known {
		return check.Warnf("cannot tell whether the tags %s may be set: reading user-tag-access needs Sys.Audit on /, and %s fails ('Sys.Modify for modifying tag') unless it is free or the token has Sys.Modify on /", tags, strings.Join(what, " and "))
	}
	if len(checkedOn) > 0 && policy.UserAllow != "free" {
		return check.Failf("%s checks tags when it creates a VM, and with user-tag-access %s it refuses every tag to a token without Sys.Modify on / (the create's check counts a tag 'HASH(0x…)' as removed, qemu-server 9.2): grant Sys.Modify on /, or set Datacenter → Options → User Tag Access to free", strings.Join(checkedOn, ", "), policy.UserAllow)
	}
	var refused []string
	for t := range judged {
		if !policy.Allows(t) {
			refused = append(refused, t)
		}
	}
	sort.Strings(refused)
	if len(refused) > 0 {
		return check.Failf("datacenter.cfg does not let the token set the tag(s) %s (user-tag-access %s%s; %s): grant Sys.Modify on / or allow them", strings.Join(refused, ", "), policy.UserAllow, registeredNote(policy, refused), strings.Join(what, " and "))
	}
	return check.Passf("tags %s may be set", tags)
}

func registeredNote(p TagPolicy, tags []string) string {
	var reg []string
	for _, t := range tags {
		if p.Registered[t] {
			reg = append(reg, t)
		}
	}
	if len(reg) == 0 {
		return ""
	}
	return "; registered tags need Sys.Modify: " + strings.Join(reg, ", ")
}

func mapKeys[V any](m map[string]V) map[string]bool {
	out := make(map[string]bool, len(m))
	for k := range m {
		out[k] = true
	}
	return out
}

// splitTagList splits a tags value as PVE does (split_list: ; , and
// white space).
func splitTagList(s string) []string {
	return strings.FieldsFunc(s, func(r rune) bool { return r == ';' || r == ',' || r == ' ' || r == '\t' || r == '\n' })
}
