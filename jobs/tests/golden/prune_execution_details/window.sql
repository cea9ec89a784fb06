SELECT id, conversation_id, (CASE WHEN kind = 'conversation' THEN completed_at WHEN settled_at IS NOT NULL THEN terminal_at END) AS age FROM runs
         WHERE account_id = $1
           AND details_pruned_at IS NULL AND conversation_id IS NOT NULL AND kind IN ('conversation', 'direct_reply')
           AND (CASE WHEN kind = 'conversation' THEN completed_at WHEN settled_at IS NOT NULL THEN terminal_at END) < $2
           AND ((CASE WHEN kind = 'conversation' THEN completed_at WHEN settled_at IS NOT NULL THEN terminal_at END), id) > ($3, $4)
         ORDER BY (CASE WHEN kind = 'conversation' THEN completed_at WHEN settled_at IS NOT NULL THEN terminal_at END), id
         LIMIT $5
