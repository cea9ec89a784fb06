SELECT id, conversation_id, sexton.run_age(kind, completed_at, terminal_at, settled_at) AS age
FROM runs
WHERE account_id = $1
  AND details_pruned_at IS NULL AND sexton.run_owner(kind, conversation_id)
  AND sexton.run_age(kind, completed_at, terminal_at, settled_at) < $2
  AND (sexton.run_age(kind, completed_at, terminal_at, settled_at), id) > ($3, $4)
ORDER BY sexton.run_age(kind, completed_at, terminal_at, settled_at), id
LIMIT $5
